// Resender: messages kept until acknowledged, sent again after an RTO that
// follows each peer's acknowledged round trips.
#include "postoffice/resender.h"

#include <pthread.h>

#include <algorithm>
#include <iterator>
#include <utility>

namespace ps {

Resender::Resender(int initial_ms, SendFn send)
    : initial_ms_(std::max<double>(initial_ms, kFloorMs)),
      send_(std::move(send)) {}

void Resender::Start() {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ps-resend");
    Loop();
  });
}

void Resender::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

bool Resender::Wants(const pb::Meta& m, Role role) {
  if (m.control().cmd() != pb::EMPTY || m.simple_app() || m.ack() ||
      m.has_origin()) {
    return false;  // replica traffic rides on the worker's resends
  }
  return m.request() ? role == Role::kWorker && IsServerId(m.recver())
                     : role == Role::kServer && IsWorkerId(m.recver());
}

Resender::Key Resender::KeyOf(int peer, const pb::Meta& m, bool request) {
  return Key{peer,
             m.app_id(),
             m.customer_id(),
             m.timestamp(),
             m.has_shard() ? m.shard() : -1,
             request};
}

RttEstimator& Resender::PeerLocked(int peer, bool large) {
  auto it = peers_.find({peer, large});
  if (it == peers_.end()) {
    it = peers_
             .emplace(
                 std::make_pair(peer, large),
                 RttEstimator(initial_ms_, kFloorMs, kMaxBackoff * initial_ms_))
             .first;
  }
  return it->second;
}

Resender::Clock::time_point Resender::DueLocked(int peer, bool large,
                                                Clock::time_point now) {
  const double rto_ms = PeerLocked(peer, large).rto_ms();
  return now + std::chrono::microseconds(static_cast<int64_t>(rto_ms * 1000));
}

void Resender::Keep(Message* msg, Clock::time_point now) {
  const int peer = msg->meta.recver();
  MutexLock lock(&mu_);
  Kept& k = kept_[KeyOf(peer, msg->meta, msg->meta.request())];
  k.sent.push_back(now);
  msg->meta.set_attempt(static_cast<int>(k.sent.size()));
  k.msg.meta = msg->meta;
  k.msg.data = msg->data;
  size_t bytes = 0;
  for (const SArray<char>& frame : msg->data) bytes += frame.size();
  k.large = bytes >= kLargeBytes;
  k.due = DueLocked(peer, k.large, now);
  if (k.due < wake_) cv_.Signal();
}

void Resender::Forget(const pb::Meta& m) {
  MutexLock lock(&mu_);
  kept_.erase(KeyOf(m.recver(), m, m.request()));
}

void Resender::ForgetPeer(int peer) {
  MutexLock lock(&mu_);
  for (auto it = kept_.begin(); it != kept_.end();) {
    it = std::get<0>(it->first) == peer ? kept_.erase(it) : std::next(it);
  }
}

void Resender::OnAck(int peer, const pb::Meta& ack, Clock::time_point now) {
  MutexLock lock(&mu_);
  auto it = kept_.find(KeyOf(peer, ack, ack.request()));
  if (it == kept_.end()) return;  // settled already: a late or second ack
  const std::vector<Clock::time_point>& sent = it->second.sent;
  const size_t attempt = static_cast<size_t>(ack.attempt());
  if (attempt >= 1 && attempt <= sent.size() && now >= sent[attempt - 1]) {
    std::chrono::duration<double, std::milli> rtt = now - sent[attempt - 1];
    std::chrono::duration<double, std::milli> at = now.time_since_epoch();
    PeerLocked(peer, it->second.large).OnSample(rtt.count(), at.count());
  }
  kept_.erase(it);
}

void Resender::OnAnswer(int peer, const pb::Meta& answer) {
  MutexLock lock(&mu_);
  kept_.erase(KeyOf(peer, answer, true));
}

Message Resender::AckOf(const pb::Meta& m) {
  Message ack;
  pb::Meta& a = ack.meta;
  a.set_ack(true);
  a.set_attempt(m.attempt());
  a.set_app_id(m.app_id());
  a.set_customer_id(m.customer_id());
  a.set_timestamp(m.timestamp());
  a.set_request(m.request());
  if (m.has_shard()) a.set_shard(m.shard());
  a.set_recver(m.sender());
  return ack;
}

std::vector<Message> Resender::TakeDueLocked(Clock::time_point now) {
  std::vector<Message> due;
  std::vector<std::pair<int, bool>> late;  // peer, large
  for (auto it = kept_.begin(); it != kept_.end();) {
    Kept& k = it->second;
    if (k.due > now) {
      ++it;
      continue;
    }
    if (k.sent.size() >= static_cast<size_t>(kMaxSends)) {
      it = kept_.erase(it);
      continue;
    }
    k.sent.push_back(now);
    k.msg.meta.set_attempt(static_cast<int>(k.sent.size()));
    due.push_back(k.msg);
    late.emplace_back(std::get<0>(it->first), k.large);
    ++it;
  }
  // One backoff per peer and size a round, however many were late.
  std::sort(late.begin(), late.end());
  late.erase(std::unique(late.begin(), late.end()), late.end());
  for (const auto& [peer, large] : late) PeerLocked(peer, large).OnTimeout();
  for (auto& [key, k] : kept_) {
    if (k.sent.back() == now) k.due = DueLocked(std::get<0>(key), k.large, now);
  }
  return due;
}

void Resender::Loop() {
  MutexLock lock(&mu_);
  while (!stop_) {
    wake_ = Clock::time_point::max();
    for (const auto& [key, k] : kept_) wake_ = std::min(wake_, k.due);
    if (wake_ == Clock::time_point::max()) {
      cv_.Wait();
    } else {
      cv_.WaitUntil(wake_);
    }
    if (stop_) break;
    std::vector<Message> due = TakeDueLocked(Clock::now());
    if (due.empty()) continue;
    lock.Unlock();
    for (Message& msg : due) {
      Status st = send_(&msg);
      if (!st.ok()) Forget(msg.meta);  // no connection: nobody to resend to
    }
    lock.Lock();
  }
}

size_t Resender::num_kept() const {
  MutexLock lock(&mu_);
  return kept_.size();
}

double Resender::RtoMs(int peer, bool large) const {
  MutexLock lock(&mu_);
  auto it = peers_.find({peer, large});
  return it == peers_.end() ? initial_ms_ : it->second.rto_ms();
}

}  // namespace ps
