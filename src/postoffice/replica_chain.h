// Replica chains (Config::replicas = 1): server rank r's keys are also held
// by server ReplicaOf(r) (ps/base.h). The KV rules that follow from it, as
// pure functions of ranks, for the postoffice and the KV layer above it to ask:
// which server-to-server data is replica traffic, and whether a dead server's
// keys are still held. Internal; no state, so thread-safe.
#ifndef PS_SRC_POSTOFFICE_REPLICA_CHAIN_H_
#define PS_SRC_POSTOFFICE_REPLICA_CHAIN_H_

#include "ps/base.h"

namespace ps {
namespace detail {

// Whether data from server `sender_rank` at server `my_rank` belongs to a
// chain: a push its primary forwards (request) or its replica's answer.
inline bool IsReplicaTraffic(bool request, int sender_rank, int my_rank,
                             int num_servers) {
  return request ? sender_rank == PrimaryOf(my_rank, num_servers)
                 : sender_rank == ReplicaOf(my_rank, num_servers);
}

// The rank of the server that holds dead server `rank`'s keys, or -1 if
// they are lost: its replica must be up (`is_down(rank)` says whether a
// server is dead) and it must not hold a dead primary's keys. A chain of one
// server holds nothing twice.
template <typename IsDown>
int CoveringServer(int rank, int num_servers, const IsDown& is_down) {
  const int replica = ReplicaOf(rank, num_servers);
  const int primary = PrimaryOf(rank, num_servers);
  if (replica == rank || primary == rank) return -1;
  if (is_down(replica) || is_down(primary)) return -1;
  return replica;
}

}  // namespace detail
}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_REPLICA_CHAIN_H_
