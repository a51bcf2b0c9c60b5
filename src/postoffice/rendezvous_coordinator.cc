// RendezvousCoordinator: the scheduler's registrations at rendezvous
// (rendezvous_coordinator.h).
#include "postoffice/rendezvous_coordinator.h"

#include <algorithm>
#include <set>

namespace ps {
namespace core {

Status RendezvousCoordinator::CheckShape(const NodeInfo& node, int servers,
                                         int workers) const {
  if (servers == num_servers_ && workers == num_workers_) return Status::OK();
  return Status::InvalidArgument(
      std::string("the ") + RoleName(node.role) + " at " + node.Address() +
      " was started for DMLC_NUM_SERVER=" + std::to_string(servers) +
      " DMLC_NUM_WORKER=" + std::to_string(workers) +
      ", the scheduler for DMLC_NUM_SERVER=" + std::to_string(num_servers_) +
      " DMLC_NUM_WORKER=" + std::to_string(num_workers_) + ": refused");
}

Status RendezvousCoordinator::CheckArrival(const NodeInfo& node) const {
  const int have = static_cast<int>(
      std::count_if(arrivals_.begin(), arrivals_.end(),
                    [&](const NodeInfo& n) { return n.role == node.role; }));
  const int want = node.role == Role::kServer ? num_servers_ : num_workers_;
  if (have >= want) {
    return Status::InvalidArgument(
        std::string("one ") + RoleName(node.role) +
        " too many: " + node.Address() + " registered after all " +
        std::to_string(want) + " expected had arrived");
  }
  return CheckRequestedRank(node, arrivals_, num_servers_, num_workers_);
}

bool RendezvousCoordinator::AnswerRefusal() {
  return ++refusals_answered_ <=
         num_servers_ + num_workers_ + kMaxExtraRefusals;
}

bool RendezvousCoordinator::Arrive(const NodeInfo& node) {
  arrivals_.push_back(node);
  return static_cast<int>(arrivals_.size()) == num_servers_ + num_workers_;
}

bool RendezvousCoordinator::ServerArrived() const {
  for (const NodeInfo& n : arrivals_) {
    if (n.role == Role::kServer) return true;
  }
  return false;
}

std::vector<NodeInfo> RendezvousCoordinator::Assign() const {
  return AssignRanks(arrivals_);
}

std::string RendezvousCoordinator::Shortfall() const {
  int servers = 0, workers = 0;
  std::string addresses;
  for (const NodeInfo& n : arrivals_) {
    (n.role == Role::kServer ? servers : workers)++;
    addresses += std::string(addresses.empty() ? "" : ", ") + RoleName(n.role) +
                 " at " + n.Address();
  }
  // Who is missing: by rank where every arrival of the role asked for one
  // (the tracker sets PS_RANK), else by count.
  std::string missing;
  for (Role role : {Role::kServer, Role::kWorker}) {
    int want = role == Role::kServer ? num_servers_ : num_workers_;
    std::set<int> ranks;
    int unranked = 0;
    for (const NodeInfo& n : arrivals_) {
      if (n.role != role) continue;
      if (n.requested_rank >= 0) {
        ranks.insert(n.requested_rank);
      } else {
        ++unranked;
      }
    }
    int absent = want - static_cast<int>(ranks.size()) - unranked;
    if (absent <= 0) continue;
    if (unranked == 0) {
      for (int r = 0; r < want; ++r) {
        if (ranks.count(r) > 0) continue;
        missing += (missing.empty() ? "" : ", ") + std::string(RoleName(role)) +
                   " " + std::to_string(r);
      }
    } else {
      missing += (missing.empty() ? "" : ", ") + std::to_string(absent) + " " +
                 RoleName(role) + (absent > 1 ? "s" : "");
    }
  }
  return std::to_string(servers) + " of " + std::to_string(num_servers_) +
         " servers and " + std::to_string(workers) + " of " +
         std::to_string(num_workers_) + " workers arrived" +
         (addresses.empty() ? "" : " (" + addresses + ")") +
         (missing.empty() ? "" : "; missing: " + missing);
}

}  // namespace core
}  // namespace ps
