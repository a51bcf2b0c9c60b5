// NodeTable and rank assignment.
#include "postoffice/node_table.h"

#include <set>

namespace ps {

std::string NodeInfo::Describe() const {
  std::string who = role == Role::kScheduler
                        ? "scheduler"
                        : std::string(RoleName(role)) + " " +
                              (rank >= 0 ? std::to_string(rank) : "?");
  return who + " (" + (host.empty() ? "address unknown" : Address()) + ")";
}

NodeInfo FromProto(const pb::NodeInfo& p) {
  NodeInfo n;
  n.role = static_cast<Role>(p.role());
  n.id = p.id();
  n.rank = p.rank();
  n.host = p.host();
  n.port = p.port();
  n.requested_rank = p.requested_rank();
  n.shm_domain = p.shm_domain();
  n.shm_probe = p.shm_probe();
  n.wire_key = p.wire_key();
  return n;
}

void ToProto(const NodeInfo& n, pb::NodeInfo* p) {
  p->set_role(static_cast<pb::NodeRole>(n.role));
  p->set_id(n.id);
  p->set_rank(n.rank);
  p->set_host(n.host);
  p->set_port(n.port);
  p->set_requested_rank(n.requested_rank);
  p->set_shm_domain(n.shm_domain);
  *p->mutable_shm_probe() = n.shm_probe;
  p->set_wire_key(n.wire_key);
}

const NodeInfo* NodeTable::Find(int id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

bool GroupContains(int group, int id) {
  if (id == kSchedulerId) return (group & kScheduler) != 0;
  if (IsServerId(id)) return (group & kServerGroup) != 0;
  if (IsWorkerId(id)) return (group & kWorkerGroup) != 0;
  return false;
}

std::vector<int> NodeTable::Ids(int group) const {
  std::vector<int> ids;
  for (const auto& [id, node] : nodes_) {
    if (GroupContains(group, id)) ids.push_back(id);
  }
  return ids;
}

std::string NodeTable::Describe(int id) const {
  const NodeInfo* n = Find(id);
  return n != nullptr
             ? n->Describe()
             : DescribeId(id) + " (unknown id " + std::to_string(id) + ")";
}

Status CheckRequestedRank(const NodeInfo& arrival,
                          const std::vector<NodeInfo>& earlier, int num_servers,
                          int num_workers) {
  if (arrival.requested_rank < 0 || arrival.role == Role::kScheduler) {
    return Status::OK();
  }
  int n = arrival.role == Role::kServer ? num_servers : num_workers;
  const char* role = RoleName(arrival.role);
  if (arrival.requested_rank >= n) {
    return Status::InvalidArgument(
        "PS_RANK=" + std::to_string(arrival.requested_rank) + " of " + role +
        " at " + arrival.Address() + " is out of range for " +
        std::to_string(n) + " " + role + "s");
  }
  for (const NodeInfo& e : earlier) {
    if (e.role == arrival.role && e.requested_rank == arrival.requested_rank) {
      return Status::InvalidArgument(
          "PS_RANK=" + std::to_string(arrival.requested_rank) + " of " + role +
          " at " + arrival.Address() + " is already taken by the " + role +
          " at " + e.Address());
    }
  }
  return Status::OK();
}

std::vector<NodeInfo> AssignRanks(std::vector<NodeInfo> arrivals) {
  for (Role role : {Role::kServer, Role::kWorker}) {
    std::set<int> taken;
    for (const NodeInfo& n : arrivals) {
      if (n.role == role && n.requested_rank >= 0)
        taken.insert(n.requested_rank);
    }
    int next = 0;
    for (NodeInfo& n : arrivals) {
      if (n.role != role) continue;
      if (n.requested_rank >= 0) {
        n.rank = n.requested_rank;
      } else {
        while (taken.count(next) > 0) ++next;
        n.rank = next++;
      }
      n.id = role == Role::kServer ? ServerRankToId(n.rank)
                                   : WorkerRankToId(n.rank);
    }
  }
  return arrivals;
}

}  // namespace ps
