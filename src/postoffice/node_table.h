// NodeTable: who is in the job (role, rank, id, address) and rank
// assignment at rendezvous. Plain values and pure functions; the Postoffice
// guards its table with its own mutex.
#ifndef PS_SRC_POSTOFFICE_NODE_TABLE_H_
#define PS_SRC_POSTOFFICE_NODE_TABLE_H_

#include <map>
#include <string>
#include <vector>

#include "meta.pb.h"
#include "ps/base.h"
#include "ps/status.h"

namespace ps {

struct NodeInfo {
  Role role = Role::kWorker;
  int id = 0;
  int rank = -1;
  std::string host;
  int port = 0;
  int requested_rank = -1;  // PS_RANK, or -1
  std::string shm_domain;   // empty: takes no shared-memory frames
  pb::SharedRef shm_probe;  // a page of its shared memory (van/shm.h)
  std::string wire_key;     // its process's static key (van/seal.h)

  std::string Address() const {
    return "tcp://" + host + ":" + std::to_string(port);
  }
  // The routing id of this node's connections ("host:port", see
  // Van::set_identity): what a message from it must arrive on.
  std::string Identity() const { return host + ":" + std::to_string(port); }
  // Identity() == id, without building it (every received message asks).
  bool HasIdentity(const std::string& id) const {
    if (id.size() <= host.size() + 1 || id.compare(0, host.size(), host) != 0 ||
        id[host.size()] != ':') {
      return false;
    }
    int p = 0;
    for (size_t i = host.size() + 1; i < id.size(); ++i) {
      if (id[i] < '0' || id[i] > '9' || p > 65535) return false;
      p = p * 10 + (id[i] - '0');
    }
    return p == port && id[host.size() + 1] != '0';
  }
  // "server 1 (tcp://127.0.0.1:4000)"
  std::string Describe() const;
};

NodeInfo FromProto(const pb::NodeInfo& p);
void ToProto(const NodeInfo& n, pb::NodeInfo* p);

class NodeTable {
 public:
  void Add(const NodeInfo& node) { nodes_[node.id] = node; }
  const NodeInfo* Find(int id) const;
  // Ids of `group`'s members (bit-or of kScheduler/kServerGroup/
  // kWorkerGroup), ascending.
  std::vector<int> Ids(int group) const;
  const std::map<int, NodeInfo>& nodes() const { return nodes_; }
  std::string Describe(int id) const;

 private:
  std::map<int, NodeInfo> nodes_;
};

// Whether `group` contains node `id`.
bool GroupContains(int group, int id);

// Checks one arrival's PS_RANK against the ones before it: out of range or
// already taken is an error naming the rank and the earlier holder.
Status CheckRequestedRank(const NodeInfo& arrival,
                          const std::vector<NodeInfo>& earlier, int num_servers,
                          int num_workers);

// Gives every arrival a rank and id: requested ranks are honoured, the rest
// take the lowest free ranks in order of arrival. Deterministic; the result
// is in the order of `arrivals` (element i is arrivals[i] with rank and id).
std::vector<NodeInfo> AssignRanks(std::vector<NodeInfo> arrivals);

}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_NODE_TABLE_H_
