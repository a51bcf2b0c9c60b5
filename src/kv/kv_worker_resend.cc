// KVWorkerCore's kept slices and replica routing (the class:
// kv_worker_impl.h): where a slice goes (Route) and whose keys an answer is
// for (AnsweredSlot); the slices kept until answered (KeepForResend),
// sent again when due (Resend) or to the replica of a server that died
// (OnFailure -> FailOver), and the answers already had (Answered).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "kv/kv_worker_impl.h"
#include "postoffice/logging.h"

namespace ps {
namespace detail {

int KVWorkerCore::Impl::ServerOf(int slot) const {
  return replicated_ ? post_->routes()->ServerOf(slot) : slot;
}

void KVWorkerCore::Impl::Route(int slot, pb::Meta* m) const {
  const int to = ServerOf(slot);
  m->set_recver(to);
  if (to != slot) {
    m->set_shard(IdToRank(slot));  // taken over
  } else {
    m->clear_shard();
  }
}

std::optional<int> KVWorkerCore::Impl::AnsweredSlot(const Message& msg) const {
  const int sender = msg.meta.sender();
  if (!IsServerId(sender)) {
    post_->CountDropped(sender, "a worker takes answers from servers only: " +
                                    DebugString(msg));
    return std::nullopt;
  }
  if (msg.meta.has_shard()) {
    const int slot = ServerRankToId(msg.meta.shard());
    if (ServerOf(slot) != sender) {
      post_->CountDropped(sender, "an answer for server " +
                                      std::to_string(msg.meta.shard()) +
                                      "'s keys, which it does not serve");
      return std::nullopt;
    }
    return slot;
  }
  if (ServerOf(sender) != sender) {
    // Its keys moved to its replica: it was declared dead, and is back
    // (frozen or cut off): fenced, whatever it answers is of the past.
    post_->CountDropped(sender,
                        "an answer of a server whose keys moved to "
                        "its replica (fenced): " +
                            DebugString(msg));
    return std::nullopt;
  }
  return sender;
}

void KVWorkerCore::Impl::KeepForResend(Unanswered&& u) {
  MutexLock lock(&resend_mu_);
  unanswered_.push_back(std::move(u));
}

void KVWorkerCore::Impl::SendAgain(const std::vector<Unanswered>& slices) {
  for (const Unanswered& u : slices) {
    Message msg = u.msg;
    Route(u.slot, &msg.meta);
    post_->CountResent();
    if (post_->config().verbose >= 1) {
      LOG(INFO) << "resending " << DebugString(msg);
    }
    Status st = post_->Send(&msg);
    if (!st.ok()) {
      LOG(WARNING) << "resend to " << post_->DescribeNode(msg.meta.recver())
                   << " failed: " << st;
    }
  }
}

void KVWorkerCore::Impl::Resend(Postoffice::Clock::time_point now) {
  // The wait doubles with every send, up to this many timeouts: a large
  // message on a slow link is not sent again and again while it travels.
  constexpr int kMaxBackoff = 16;
  std::vector<Unanswered> due;
  std::vector<std::string> stalled;
  {
    MutexLock lock(&resend_mu_);
    for (size_t i = 0; i < unanswered_.size();) {
      Unanswered& u = unanswered_[i];
      if (!tracker_.Awaits(u.ts, u.slot)) {
        if (&u != &unanswered_.back()) u = std::move(unanswered_.back());
        unanswered_.pop_back();
        continue;
      }
      if (now >= u.due) {
        int backoff = std::min(kMaxBackoff, 1 << std::min(u.sends, 4));
        u.due = now + std::chrono::milliseconds(int64_t{resend_ms_} * backoff);
        ++u.sends;
        due.push_back(u);
      }
      const int64_t waited_ms = MsSince(u.sent, now);
      if (!u.reported && waited_ms >= stall_ms_) {
        u.reported = true;
        stalled.push_back(DescribeStalled(u, waited_ms));
      }
      ++i;
    }
  }
  for (const std::string& s : stalled) LOG(WARNING) << s;
  // To whoever serves those keys now (a replica, after a failover).
  SendAgain(due);
}

std::string KVWorkerCore::Impl::DescribeStalled(const Unanswered& u,
                                                int64_t waited_ms) const {
  const pb::Meta& m = u.msg.meta;
  std::string what = m.push() && m.pull() ? "push+pull"
                     : m.push()           ? "push"
                                          : "pull";
  return "stalled: request " + std::to_string(u.ts) + " (" + what + ", cmd " +
         std::to_string(m.head()) + ") for " + post_->DescribeNode(u.slot) +
         "'s keys unanswered for " + Seconds(waited_ms) + ", sent " +
         std::to_string(u.sends) + " times, now to " +
         post_->DescribeNode(ServerOf(u.slot)) +
         " (reported once, after PS_HEARTBEAT_TIMEOUT_MS + " +
         std::to_string(kStallGraceMs) + " ms)";
}

KVWorkerCore::Impl::Answer KVWorkerCore::Impl::Answered(int ts, int server) {
  MutexLock lock(&resend_mu_);
  // From the end: the newest requests are the likeliest answered.
  auto it = std::find_if(
      unanswered_.rbegin(), unanswered_.rend(),
      [&](const Unanswered& u) { return u.ts == ts && u.slot == server; });
  std::pair<int, int> key{ts, server};
  if (it == unanswered_.rend()) {
    return std::find(answered_.begin(), answered_.end(), key) != answered_.end()
               ? Answer::kDuplicate
               : Answer::kUnknown;
  }
  if (it != unanswered_.rbegin()) *it = std::move(unanswered_.back());
  unanswered_.pop_back();
  if (answered_.size() < kAnsweredKept) {
    answered_.push_back(key);
  } else {
    answered_[answered_next_] = key;
    answered_next_ = (answered_next_ + 1) % kAnsweredKept;
  }
  return Answer::kAwaited;
}

void KVWorkerCore::Impl::OnFailure(int id, const Status& why) {
  // id < 0: no one server (the node stops): every request fails.
  if (id < 0) return tracker_.FailServer(id, why);
  const std::shared_ptr<const core::Routes> routes = post_->routes();
  const int to = routes->ServerOf(id);
  if (to != id) return FailOver(Takeover{id, to});
  // Lost for good: its keys, and those of the servers it had taken over.
  tracker_.FailServer(id, why);
  for (int slot : routes->CoveredBy(id)) tracker_.FailServer(slot, why);
}

void KVWorkerCore::Impl::FailOver(const Takeover& takeover) {
  LOG(WARNING) << "requests for " << post_->DescribeNode(takeover.server)
               << " go to " << post_->DescribeNode(takeover.replica)
               << ", its replica";
  std::vector<Unanswered> again;
  {
    MutexLock lock(&resend_mu_);
    auto due = Postoffice::Clock::now() + std::chrono::milliseconds(resend_ms_);
    for (Unanswered* u : takeover.Moved(&unanswered_)) {
      u->due = due;
      again.push_back(*u);
    }
  }
  SendAgain(again);
}

}  // namespace detail
}  // namespace ps
