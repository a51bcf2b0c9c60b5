// Replicator: a shard's place in a replica chain (PS_REPLICAS=1, docs/
// architecture.md "Replication"), for any shard keyed by server rank. A
// server holds its own keys and, as the replica of server PrimaryOf(its
// rank), that server's: one shard object for each. The KV server core
// forwards every push to a primary's keys to its replica (ReplicaCopy,
// src/kv/slicer.h), or the shard forwards each step's sum once (a BSP
// DenseShard: KVServer::set_replica_steps, ReplicateStep), and the worker's
// answer waits until the replica answered; the replica's shard gets those
// copies or sums, and once the primary died its workers' requests, through
// the server's replica handle. So the replica's copy of the weights and
// optimizer state is a second shard fed the same pushes, or sums, in the
// same order; what a shard needs to take part is to be registered in the
// right slot, which this class owns:
//
//   own keys      set_request_handler(shard)
//   replica copy  set_request_handler(shard, replica) (first: before the
//                 server's own shard, kv_app.h)
//
// and the rank whose keys the shard holds (HeldRank), and whether that
// server is down (ServerDown). Destroying it
// unregisters the handle (waiting out a running one), so the shard may die
// before its server.
//
// Thread-safety: Attach and the destructor run on the thread that makes and
// destroys the shard; the handles it registers run on the server's receive
// thread (requests) and the receive, monitor or watch thread (failures).
#ifndef PS_SRC_KV_REPLICATOR_H_
#define PS_SRC_KV_REPLICATOR_H_

#include <functional>
#include <utility>

#include "postoffice/postoffice.h"
#include "ps/base.h"
#include "ps/kv_app.h"
#include "ps/node.h"
#include "ps/status.h"

namespace ps {

template <typename Val>
class Replicator {
 public:
  // `server` must outlive this object. `replica`: the shard holds the keys
  // of the server this one is the replica of, not its own.
  Replicator(KVServer<Val>* server, bool replica)
      : server_(server), replica_(replica) {}
  ~Replicator() { Detach(); }
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // Registers the shard (its request and failure handles) in its role's
  // slot. Once: the server takes one handler per slot.
  void Attach(KVRequestHandler<Val>* shard) {
    attached_ = true;
    server_->set_request_handler(shard, replica_);
  }

  // Unregisters them (waits for a running request handle to return); later
  // requests for these keys are held, then refused, by the server.
  void Detach() {
    if (!attached_) return;
    attached_ = false;
    if (replica_) {
      server_->clear_replica_handle();
    } else {
      server_->clear_request_handle();
    }
  }

  bool replica() const { return replica_; }

  // Whether server `rank` is down now, as the node's routes say (a replica
  // stands in for its primary once it is); false for rank -1.
  bool ServerDown(int rank) const {
    return rank >= 0 && server_->node()->postoffice()->routes()->IsDown(
                            ServerRankToId(rank));
  }

  // The server rank whose keys a shard of server `my_rank` holds: its own,
  // or (a replica) its primary's.
  static int HeldRank(int my_rank, int num_servers, bool replica) {
    return replica ? PrimaryOf(my_rank, num_servers) : my_rank;
  }

 private:
  KVServer<Val>* const server_;
  const bool replica_;
  bool attached_ = false;
};

}  // namespace ps

#endif  // PS_SRC_KV_REPLICATOR_H_
