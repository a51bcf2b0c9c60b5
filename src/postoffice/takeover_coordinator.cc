// TakeoverCoordinator: a restarted scheduler taking a running job over
// (takeover_coordinator.h).
#include "postoffice/takeover_coordinator.h"

namespace ps {
namespace core {

Status TakeoverCoordinator::Check(const NodeInfo& node,
                                  const std::vector<NodeInfo>& covered,
                                  int servers, int workers) const {
  const int count = node.role == Role::kServer ? num_servers_ : num_workers_;
  const std::string report =
      "a member's report (" + node.Describe() + ") that does not fit this job";
  if (max_restarts_ == 0) {
    return Status::InvalidArgument(report +
                                   " (a scheduler takes a running job over "
                                   "only with PS_MAX_RESTARTS > 0)");
  }
  if (servers != num_servers_ || workers != num_workers_) {
    return Status::InvalidArgument(
        report +
        ": it was started for DMLC_NUM_SERVER=" + std::to_string(servers) +
        " DMLC_NUM_WORKER=" + std::to_string(workers) +
        ", this scheduler for DMLC_NUM_SERVER=" + std::to_string(num_servers_) +
        " DMLC_NUM_WORKER=" + std::to_string(num_workers_));
  }
  if (node.role == Role::kScheduler || node.rank < 0 || node.rank >= count) {
    return Status::InvalidArgument(report + ": no such rank");
  }
  const int id = node.role == Role::kServer ? ServerRankToId(node.rank)
                                            : WorkerRankToId(node.rank);
  if (node.id != id) {
    return Status::InvalidArgument(report + ": its id is " +
                                   std::to_string(node.id) + ", not " +
                                   std::to_string(id));
  }
  for (const NodeInfo& c : covered) {
    if (c.role != Role::kServer || c.rank < 0 || c.rank >= num_servers_ ||
        c.id != ServerRankToId(c.rank) || c.id == node.id) {
      return Status::InvalidArgument(report + ": it names " + c.Describe() +
                                     " (id " + std::to_string(c.id) +
                                     ") taken over, no server of this job");
    }
  }
  return Status::OK();
}

TakeoverCoordinator::Outcome TakeoverCoordinator::Classify(
    const NodeInfo& node, bool running, const NodeInfo* known) const {
  if (running) {
    // Copies sent while we were not up yet are answered again; anything
    // else (a job that registers anew) is no report of ours.
    return known != nullptr && known->Identity() == node.Identity()
               ? Outcome::kAnswerAgain
               : Outcome::kRefused;
  }
  return reported_.count(node.id) > 0 ? Outcome::kCopy : Outcome::kNew;
}

bool TakeoverCoordinator::Take(const NodeInfo& node,
                               const std::vector<NodeInfo>& covered) {
  reported_[node.id] = node;
  covered_.erase(node.id);  // it lives: whoever said otherwise
  for (const NodeInfo& c : covered) {
    if (reported_.count(c.id) == 0) covered_.emplace(c.id, c);
  }
  complete_ = reported() + static_cast<int>(covered_.size()) ==
              num_servers_ + num_workers_;
  return complete_;
}

std::vector<NodeInfo> TakeoverCoordinator::Covered() const {
  std::vector<NodeInfo> nodes;
  for (const auto& [id, node] : covered_) nodes.push_back(node);
  return nodes;
}

std::vector<NodeInfo> TakeoverCoordinator::MissingNodes() const {
  std::vector<NodeInfo> missing;
  auto add = [&](Role role, int rank, int id) {
    if (reported_.count(id) > 0 || covered_.count(id) > 0) return;
    NodeInfo node;
    node.id = id;
    node.role = role;
    node.rank = rank;
    missing.push_back(node);
  };
  for (int r = 0; r < num_servers_; ++r) {
    add(Role::kServer, r, ServerRankToId(r));
  }
  for (int r = 0; r < num_workers_; ++r) {
    add(Role::kWorker, r, WorkerRankToId(r));
  }
  return missing;
}

std::string TakeoverCoordinator::Missing() const {
  std::string missing;
  for (const NodeInfo& node : MissingNodes()) {
    missing += (missing.empty() ? "" : ", ") + DescribeId(node.id);
  }
  return missing;
}

}  // namespace core
}  // namespace ps
