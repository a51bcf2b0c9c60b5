// RejoinCoordinator: the scheduler's side of a restarted worker's rejoin
// (rejoin_coordinator.h).
#include "postoffice/rejoin_coordinator.h"

#include <utility>

#include "postoffice/logging.h"

namespace ps {
namespace core {

Status RejoinCoordinator::Check(
    const NodeInfo& node,
    const std::function<std::string(int)>& describe) const {
  const std::string role = RoleName(node.role);
  const std::string who = role + " at " + node.Address();
  if (max_restarts_ == 0) {
    return Status::InvalidArgument(
        "one " + role + " too many: " + node.Address() +
        " registered after all expected had arrived (a restarted worker "
        "rejoins only with PS_MAX_RESTARTS > 0)");
  }
  if (node.role != Role::kWorker) {
    return Status::InvalidArgument("the " + who +
                                   " registered while the job runs: only "
                                   "restarted workers rejoin a running job");
  }
  if (node.requested_rank < 0 || node.requested_rank >= num_workers_) {
    return Status::InvalidArgument(
        "the " + who +
        " registered while the job runs without a worker rank (PS_RANK in "
        "[0, " +
        std::to_string(num_workers_) +
        ")): a restarted worker rejoins under its rank");
  }
  const int id = WorkerRankToId(node.requested_rank);
  auto it = rejoins_.find(id);
  if (it != rejoins_.end()) {
    return Status::InvalidArgument(
        "a restart of " + describe(id) + " is rejoining already (from " +
        it->second.node.Address() + "); " + who + " refused");
  }
  return Status::OK();
}

int RejoinCoordinator::Register(const NodeInfo& node, int temp_id,
                                Clock::time_point now) {
  const int id = WorkerRankToId(node.requested_rank);
  Rejoin& r = rejoins_[id];
  r.node = node;
  r.temp_id = temp_id;
  r.since = now;
  return id;
}

bool RejoinCoordinator::Waiting(int id) const {
  auto it = rejoins_.find(id);
  return it != rejoins_.end() && !it->second.started;
}

RejoinCoordinator::Started RejoinCoordinator::Start(
    int id, const std::vector<int>& tell, Clock::time_point now) {
  Rejoin& r = rejoins_.at(id);
  r.started = true;
  r.started_at = now;
  r.node.id = id;
  r.node.rank = IdToRank(id);
  r.pending.insert(tell.begin(), tell.end());
  r.pending.erase(id);
  return Started{r.node, r.temp_id, r.pending.empty()};
}

RejoinCoordinator::Answer RejoinCoordinator::Answered(int member,
                                                      const NodeInfo& about) {
  auto it = rejoins_.find(about.id);
  // About this successor (a late answer may be about one that died).
  if (it == rejoins_.end() || !it->second.started ||
      about.Identity() != it->second.node.Identity() ||
      it->second.pending.erase(member) == 0) {
    return Answer::kUnexpected;
  }
  return it->second.pending.empty() ? Answer::kComplete : Answer::kWaiting;
}

bool RejoinCoordinator::OnLost(int id, bool was_rejoining, bool awaited,
                               std::vector<int>* complete) {
  // The restarts under way wait no more for this node's answer.
  for (auto& [rid, r] : rejoins_) {
    if (r.started && r.pending.erase(id) > 0 && r.pending.empty()) {
      complete->push_back(rid);
    }
  }
  auto own = rejoins_.find(id);
  if (own == rejoins_.end()) return false;
  if (own->second.started && was_rejoining) {
    rejoins_.erase(own);  // the successor died while rejoining
    return false;
  }
  // Its successor registered before this death was known.
  return !own->second.started && awaited;
}

int RejoinCoordinator::OnConnectionLost(int temp_id, NodeInfo* node) {
  for (auto it = rejoins_.begin(); it != rejoins_.end(); ++it) {
    if (!it->second.started && it->second.temp_id == temp_id) {
      const int id = it->first;
      *node = it->second.node;
      rejoins_.erase(it);
      return id;
    }
  }
  return -1;
}

double RejoinCoordinator::Finish(int id, Clock::time_point now) {
  auto it = rejoins_.find(id);
  if (it == rejoins_.end()) return 0;
  const double s =
      std::chrono::duration<double>(now - it->second.since).count();
  rejoins_.erase(it);
  return s;
}

void RejoinCoordinator::Tick(Clock::time_point now, int64_t answer_ms,
                             int64_t death_ms, std::vector<Overdue>* overdue,
                             std::vector<Refused>* refused) {
  for (auto it = rejoins_.begin(); it != rejoins_.end();) {
    const Rejoin& r = it->second;
    if (r.started && MsSince(r.started_at, now) > answer_ms) {
      overdue->push_back(Overdue{
          it->first, std::vector<int>(r.pending.begin(), r.pending.end())});
    } else if (!r.started && MsSince(r.since, now) > death_ms) {
      refused->push_back(Refused{it->first, r.temp_id, r.node});
      it = rejoins_.erase(it);
      continue;
    }
    ++it;
  }
}

}  // namespace core
}  // namespace ps
