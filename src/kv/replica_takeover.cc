// ReplicaHold: the primary's side of the replica takeover (see the header).
#include "kv/replica_takeover.h"

#include <iterator>

#include "kv/request_internals.h"
#include "ps/base.h"

namespace ps {
namespace detail {

// ---- ReplicaHold --------------------------------------------------------

int ReplicaHold::replica_id() const {
  return ServerRankToId(ReplicaOf(my_rank_(), num_servers_));
}

void ReplicaHold::Forwarded(const KVMeta& req) {
  MutexLock lock(&mu_);
  // The replica went down since Forwards: OnFailure released what was
  // held, or will; this answer is not held.
  if (down_(replica_id())) return;
  held_.emplace(KeyOf(req), Held());
}

void ReplicaHold::ForwardedStep(const Message& forward,
                                const std::vector<KVMeta>& covers) {
  const int ticket = forward.meta.timestamp();
  Step step{forward, {}};
  MutexLock lock(&mu_);
  if (down_(replica_id())) return;  // as in Forwarded
  for (const KVMeta& req : covers) {
    Held& held = held_[KeyOf(req)];
    held.step = ticket;
    step.covers.push_back(KeyOf(req));
  }
  steps_[ticket] = std::move(step);
}

bool ReplicaHold::Awaits(const KVMeta& req) const {
  MutexLock lock(&mu_);
  return held_.count(KeyOf(req)) > 0;
}

std::optional<Message> ReplicaHold::StepOf(const KVMeta& req) const {
  MutexLock lock(&mu_);
  auto it = held_.find(KeyOf(req));
  if (it == held_.end() || it->second.step < 0) return std::nullopt;
  auto step = steps_.find(it->second.step);
  if (step == steps_.end()) return std::nullopt;
  return step->second.forward;
}

bool ReplicaHold::Hold(const KVMeta& req, Message* msg) {
  // Only a worker's request for this server's own keys was forwarded.
  if (!on_ || RequestInternals::Of(req).reply_to >= 0 ||
      (req.shard >= 0 && req.shard != my_rank_())) {
    return false;
  }
  MutexLock lock(&mu_);
  auto it = held_.find(KeyOf(req));
  if (it == held_.end()) return false;
  if (it->second.replica_answered) {
    held_.erase(it);
    return false;
  }
  it->second.answer = std::move(*msg);
  it->second.answered = true;
  return true;
}

ReplicaHold::ReplicaAnswer ReplicaHold::OnReplicaAnswer(int worker,
                                                        int customer_id,
                                                        int timestamp) {
  ReplicaAnswer result;
  std::vector<Key> keys = {{worker, customer_id, timestamp}};
  MutexLock lock(&mu_);
  if (worker == ServerRankToId(my_rank_())) {
    auto step = steps_.find(timestamp);
    if (step == steps_.end()) {
      result.duplicate = true;
      return result;
    }
    keys = std::move(step->second.covers);
    steps_.erase(step);
  } else if (held_.count(keys[0]) == 0) {
    result.duplicate = true;
    return result;
  }
  for (const Key& key : keys) {
    auto it = held_.find(key);
    if (it == held_.end()) continue;  // refused or forgotten since
    if (!it->second.answered) {
      it->second.replica_answered = true;
      continue;
    }
    result.release.push_back(std::move(it->second.answer));
    held_.erase(it);
  }
  return result;
}

std::vector<Message> ReplicaHold::OnFailure(int id) {
  std::vector<Message> answers;
  if (!on_ || id < 0 || id != replica_id()) return answers;
  MutexLock lock(&mu_);
  for (auto& [key, held] : held_) {
    if (held.answered) answers.push_back(std::move(held.answer));
  }
  held_.clear();
  steps_.clear();
  return answers;
}

void ReplicaHold::Refused(const KVMeta& req) {
  if (!on_) return;
  MutexLock lock(&mu_);
  held_.erase(KeyOf(req));
}

void ReplicaHold::ForgetWorker(int id) {
  MutexLock lock(&mu_);
  for (auto it = held_.begin(); it != held_.end();) {
    it = std::get<0>(it->first) == id ? held_.erase(it) : std::next(it);
  }
}

}  // namespace detail
}  // namespace ps
