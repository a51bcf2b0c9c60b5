// The replica takeover (PS_REPLICAS=1, docs/architecture.md "Replicated
// shards") in the KV layer, as small protocol objects fed inputs: they do
// no I/O, they return what changed and what to send, and the KV cores
// (kv_worker_core.cc, kv_server_core.cc) send it. Who serves each
// server's keys is not theirs to keep: the node's routes say it
// (src/postoffice/routes.h: Routes::ServerOf, Unserved).
//
//   Takeover       (worker)   a covered server's keys moved to its replica:
//                  which of the unanswered slices go there.
//   ReplicaHold    (primary)  the answers to forwarded pushes, held until
//                  the replica answered their copy, or the forward of the
//                  step they were summed into (ForwardedStep); released
//                  when it did or died, forgotten with the process of a
//                  rejoined worker.
//
// A "slot" is the id of the server whose keys a slice asks for (the one
// placement gave it), whoever serves them now.
//
// Thread-safety: any thread; each object has one lock of its own, never held
// while anything else runs. Internal.
#ifndef PS_SRC_KV_REPLICA_TAKEOVER_H_
#define PS_SRC_KV_REPLICA_TAKEOVER_H_

#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "ps/kv_core.h"
#include "ps/status.h"
#include "van/message.h"
#include "van/sync.h"

namespace ps {
namespace detail {

// A covered server's keys moved to its replica.
struct Takeover {
  int server;   // the dead server's id: the slot that moved
  int replica;  // the id of the server that serves its keys now

  bool Moves(int slot) const { return slot == server; }
  // The entries of `slices` (anything with an int `slot`) that asked for
  // the moved keys, in order: what the dead server left unanswered, to
  // send again to the replica. Pointers into `slices`, valid while it is
  // not changed.
  template <typename Slice>
  std::vector<Slice*> Moved(std::vector<Slice>* slices) const {
    std::vector<Slice*> moved;
    for (Slice& slice : *slices) {
      if (Moves(slice.slot)) moved.push_back(&slice);
    }
    return moved;
  }
};

// The primary's side: a push to this server's own keys reaches its replica,
// copied on its own (Forwarded) or as part of a step's effect that the
// handle forwards once for all the pushes summed into it (ForwardedStep),
// and the worker's answer waits until the replica answered that message, so
// that a push a worker saw answered is on both servers and the replica can
// take over without it. Held answers are keyed by the worker's request
// (worker, customer, timestamp); a step forward by this server's own id,
// customer 0 and its ticket.
class ReplicaHold {
 public:
  // `replicas`: Config::replicas (0: no chain, nothing is held).
  // `my_rank`: this server's rank, asked when needed (a server may be made
  // before its node's rendezvous gave it one). `down`: whether node `id` is
  // down now (the node's routes; they hold a death before OnFailure is
  // called for it).
  ReplicaHold(int replicas, int num_servers, std::function<int()> my_rank,
              std::function<bool(int id)> down)
      : on_(replicas > 0),
        num_servers_(num_servers),
        my_rank_(std::move(my_rank)),
        down_(std::move(down)) {}

  // The id of this server's replica.
  int replica_id() const;

  // Whether a push to this server's own keys is copied to the replica: a
  // chain, and its replica not down.
  bool Forwards() const { return on_ && !down_(replica_id()); }

  // A copy of push req goes to the replica (before it is sent: the answer
  // may come first): req's answer waits for the replica's. A copy sent
  // again leaves what is held as it was.
  void Forwarded(const KVMeta& req) EXCLUDES(mu_);

  // A step forward `forward` (its timestamp a ticket of this server's own)
  // goes to the replica in place of copies of the pushes `covers`: their
  // answers wait for the replica's answer to it. It is kept until then, to
  // be sent again (StepOf).
  void ForwardedStep(const Message& forward, const std::vector<KVMeta>& covers)
      EXCLUDES(mu_);

  // Whether req's answer still waits for the replica's.
  bool Awaits(const KVMeta& req) const EXCLUDES(mu_);

  // The step forward req's answer waits for, to send again; none when it
  // waits for none (a copy of its own, or nothing).
  std::optional<Message> StepOf(const KVMeta& req) const EXCLUDES(mu_);

  // The handle's answer `msg` to req: true when it is kept (moved from) until
  // the replica answered; false: send it now (the replica answered already,
  // or req was not forwarded: not a push to this server's own keys from its
  // worker, or its replica is gone).
  bool Hold(const KVMeta& req, Message* msg) EXCLUDES(mu_);

  // What the replica's answer to the copy of (worker, customer, timestamp),
  // or (worker: this server) to a step forward, does: nothing yet (the
  // handle has not answered), releases the held answers, or nothing at all
  // (no message awaits one: a second answer).
  struct ReplicaAnswer {
    bool duplicate = false;
    std::vector<Message> release;  // the workers' answers, to send now
  };
  ReplicaAnswer OnReplicaAnswer(int worker, int customer_id, int timestamp)
      EXCLUDES(mu_);

  // Node `id` failed. When it is the replica, nothing more is forwarded or
  // held: the answers the handle gave are released (returned, in request
  // order), the others will go as the handle gives them (a push forwarded
  // meanwhile is not held: the replica is down already).
  std::vector<Message> OnFailure(int id) EXCLUDES(mu_);

  // req was refused (ResponseError): its answer is the error, sent now.
  void Refused(const KVMeta& req) EXCLUDES(mu_);

  // Worker `id` was restarted: the old process's held answers are dropped
  // (its replica's answers to them are then duplicates).
  void ForgetWorker(int id) EXCLUDES(mu_);

 private:
  using Key = std::tuple<int, int, int>;  // worker, customer, timestamp
  struct Held {
    bool answered = false;  // by the handle: `answer` is ready
    bool replica_answered = false;
    int step = -1;  // the ticket of the step forward it waits for, if any
    Message answer;
  };
  struct Step {
    Message forward;
    std::vector<Key> covers;
  };
  static Key KeyOf(const KVMeta& req) {
    return {req.sender, req.customer_id, req.timestamp};
  }

  const bool on_;
  const int num_servers_;
  const std::function<int()> my_rank_;
  const std::function<bool(int)> down_;
  mutable Mutex mu_;
  std::map<Key, Held> held_ GUARDED_BY(mu_);
  std::map<int, Step> steps_ GUARDED_BY(mu_);  // by ticket
};

}  // namespace detail
}  // namespace ps

#endif  // PS_SRC_KV_REPLICA_TAKEOVER_H_
