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

Resender::Key Resender::KeyOf(int peer, const pb::Acked& a) {
  return Key{peer,
             a.app_id(),
             a.customer_id(),
             a.timestamp(),
             a.has_shard() ? a.shard() : -1,
             a.request()};
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
  msg->meta.clear_acks();
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
  if (wake_ == Clock::time_point::max()) cv_.Signal();
  auto owed = owed_.find(peer);
  if (owed != owed_.end()) {
    for (pb::Acked& a : owed->second.acks) *msg->meta.add_acks() = std::move(a);
    owed_.erase(owed);
  }
}

void Resender::Owe(int peer, const pb::Meta& m, Clock::time_point now) {
  MutexLock lock(&mu_);
  Owed& o = owed_[peer];
  if (o.acks.empty()) {
    o.due = now +
            std::chrono::microseconds(static_cast<int64_t>(kAckDelayMs * 1000));
  }
  o.acks.push_back(AckedOf(m));
  if (o.acks.size() >= kMaxOwed) o.due = now;
  if (wake_ == Clock::time_point::max() || o.due == now) cv_.Signal();
}

void Resender::Forget(const pb::Meta& m) {
  MutexLock lock(&mu_);
  kept_.erase(KeyOf(m.recver(), m, m.request()));
}

void Resender::ForgetPeer(int peer) {
  MutexLock lock(&mu_);
  owed_.erase(peer);
  for (auto it = kept_.begin(); it != kept_.end();) {
    it = std::get<0>(it->first) == peer ? kept_.erase(it) : std::next(it);
  }
}

void Resender::OnAck(int peer, const pb::Meta& m, Clock::time_point now) {
  MutexLock lock(&mu_);
  if (m.ack() && m.attempt() > 0) {
    SettleLocked(peer, KeyOf(peer, m, m.request()), m.attempt(), now);
  }
  for (const pb::Acked& a : m.acks()) {
    SettleLocked(peer, KeyOf(peer, a), a.attempt(), now);
  }
}

void Resender::SettleLocked(int peer, const Key& key, int attempt,
                            Clock::time_point now) {
  auto it = kept_.find(key);
  if (it == kept_.end()) return;  // settled already: a late or second ack
  const std::vector<Clock::time_point>& sent = it->second.sent;
  const size_t n = static_cast<size_t>(attempt);
  if (n >= 1 && n <= sent.size() && now >= sent[n - 1]) {
    std::chrono::duration<double, std::milli> rtt = now - sent[n - 1];
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

pb::Acked Resender::AckedOf(const pb::Meta& m) {
  pb::Acked a;
  a.set_app_id(m.app_id());
  a.set_customer_id(m.customer_id());
  a.set_timestamp(m.timestamp());
  a.set_request(m.request());
  if (m.has_shard()) a.set_shard(m.shard());
  a.set_attempt(m.attempt());
  return a;
}

void Resender::TakeOwedLocked(Clock::time_point now,
                              std::vector<Message>* out) {
  for (auto it = owed_.begin(); it != owed_.end();) {
    if (it->second.due > now) {
      ++it;
      continue;
    }
    Message ack;
    ack.meta.set_ack(true);
    ack.meta.set_recver(it->first);
    for (pb::Acked& a : it->second.acks) *ack.meta.add_acks() = std::move(a);
    out->push_back(std::move(ack));
    it = owed_.erase(it);
  }
}

std::vector<Message> Resender::TakeDueLocked(Clock::time_point now) {
  std::vector<Message> due;
  TakeOwedLocked(now, &due);
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
    // While anything is kept or owed, a tick: what comes due sooner than
    // the wake-up is at most kTickMs late, and a message sent or received
    // wakes nobody (two wake-ups a round trip would cost more than it).
    wake_ = Clock::time_point::max();
    for (const auto& [key, k] : kept_) wake_ = std::min(wake_, k.due);
    for (const auto& [peer, o] : owed_) wake_ = std::min(wake_, o.due);
    if (wake_ != Clock::time_point::max()) {
      wake_ = std::min(
          wake_, Clock::now() + std::chrono::microseconds(
                                    static_cast<int64_t>(kTickMs * 1000)));
    }
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
      // No connection: nobody to resend to (an acknowledgement is not kept).
      if (!st.ok() && !msg.meta.ack()) Forget(msg.meta);
    }
    lock.Lock();
  }
}

size_t Resender::num_kept() const {
  MutexLock lock(&mu_);
  return kept_.size();
}

size_t Resender::num_owed() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [peer, o] : owed_) n += o.acks.size();
  return n;
}

double Resender::RtoMs(int peer, bool large) const {
  MutexLock lock(&mu_);
  auto it = peers_.find({peer, large});
  return it == peers_.end() ? initial_ms_ : it->second.rto_ms();
}

}  // namespace ps
