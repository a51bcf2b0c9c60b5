// ps::Postoffice: ps-lite's process-wide view of the default node
// (Postoffice::Get()), for programs written against ps-lite. Every call
// goes to the node of the ps.h convenience layer (ps::Start), except
// Barrier(customer_id, ...), which goes to that customer's node (ps.h:
// a worker customer after a process's first has one of its own). The
// facade creates the default node from the environment on first use, so that,
// as in ps-lite, roles and counts are known before Start and apps (KVServer,
// SimpleApp) may be built before it. Our own API (ps::Node) needs none of this.
//
// Thread-safety: every call may be made from any thread; Start/Finalize by
// several threads of one process, one customer each (see ps.h).
#ifndef PS_INTERNAL_POSTOFFICE_H_
#define PS_INTERNAL_POSTOFFICE_H_

#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "ps/base.h"
#include "ps/internal/utils.h"
#include "ps/range.h"

namespace ps {

class Postoffice {
 public:
  using Callback = std::function<void()>;

  static Postoffice* Get();

  // ps::Start / ps::StartAsync / ps::Finalize (ps.h).
  void Start(int customer_id, const char* argv0, const bool do_barrier);
  void Finalize(const int customer_id, const bool do_barrier = true);
  // Runs once the default node has stopped, in the Finalize that stops it.
  // A later registration replaces an earlier one (as in ps-lite).
  void RegisterExitCallback(const Callback& cb);

  // The ids of node `node_id`, or of every node of a group id (a bit-or of
  // kScheduler, kServerGroup, kWorkerGroup). Valid after Start.
  const std::vector<int>& GetNodeIDs(int node_id) const;
  // Server rank r's key range under the default placement (PS_MAX_KEY,
  // the whole key space unless set: ps-lite's split).
  const std::vector<Range>& GetServerKeyRanges();

  static int WorkerRankToID(int rank) { return rank * 2 + 9; }
  static int ServerRankToID(int rank) { return rank * 2 + 8; }
  static int IDtoRank(int id) { return std::max((id - 8) / 2, 0); }

  int num_workers() const;
  int num_servers() const;
  int my_rank() const;  // after Start
  int is_worker() const;
  int is_server() const;
  int is_scheduler() const;
  int verbose() const;  // PS_VERBOSE
  // True on a restarted worker that rejoined the running job under its
  // rank (PS_MAX_RESTARTS; Node::rejoined): as in ps-lite, it skips the
  // start barrier and should fetch the current state before it goes on.
  // Other dead nodes are not replaced: the job fails naming them.
  bool is_recovery() const;

  // Blocks until every node of `node_group` entered the barrier. This
  // node's customers share its one arrival: call it from one thread of a
  // process at a time.
  void Barrier(int customer_id, int node_group);

 private:
  Postoffice() = default;
  DISALLOW_COPY_AND_ASSIGN(Postoffice);

  mutable std::mutex mu_;
  mutable std::map<int, std::vector<int>> node_ids_;  // cached by id
  std::vector<Range> server_key_ranges_;
};

// ps-lite's verbose log: shown when PS_VERBOSE >= x.
#ifndef PS_VLOG
#define PS_VLOG(x) LOG_IF(INFO, (x) <= ::ps::Postoffice::Get()->verbose())
#endif

}  // namespace ps

#endif  // PS_INTERNAL_POSTOFFICE_H_
