// RejoinCoordinator: the scheduler's side of a restarted worker's rejoin
// (PS_MAX_RESTARTS), as a state machine. A worker that registers while the
// job runs restarts the dead one of its rank:
//
//   Register ─> waiting ──(its predecessor is awaited: Start)──> started
//      started ──(every live member answered NODE_JOINED: Answered /
//                 the silent ones lost: OnLost / overdue: Tick)──> Finish
//   waiting ──(the predecessor still alive too long: Tick)──> refused
//   waiting ──(its connection closed: OnConnectionLost)──> forgotten
//   started ──(the successor itself lost: OnLost)──> forgotten
//
// Inputs: registrations, members' answers, the membership's losses, the
// connection's loss and timer ticks; outputs: what the caller does (tell
// these members, finish this rejoin, refuse that registration). No I/O and
// no node table: the Postoffice sends NODE_JOINED and the table, rekeys the
// connection and applies the membership's transitions (rejoin.cc); tests
// feed it inputs.
//
// Thread-compatible: its owner serializes the calls (the Postoffice holds
// its mu_).
#ifndef PS_SRC_POSTOFFICE_REJOIN_COORDINATOR_H_
#define PS_SRC_POSTOFFICE_REJOIN_COORDINATOR_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "postoffice/node_table.h"
#include "ps/status.h"

namespace ps {
namespace core {

class RejoinCoordinator {
 public:
  using Clock = std::chrono::steady_clock;

  RejoinCoordinator(int num_workers, int max_restarts)
      : num_workers_(num_workers), max_restarts_(max_restarts) {}

  // Why `node`, registering while the job runs, may not rejoin it: no
  // restarts allowed, not a worker, no worker rank (PS_RANK), or a restart
  // of that rank under way already. OK if it may. `describe(id)` names a
  // node of the table ("worker 1 at tcp://...").
  Status Check(const NodeInfo& node,
               const std::function<std::string(int)>& describe) const;
  // Takes the registration of `node` (checked) on its connection's
  // temporary id `temp_id`; returns the id of the worker it restarts. It
  // waits until that worker is declared dead (Start).
  int Register(const NodeInfo& node, int temp_id, Clock::time_point now);

  // A registration waiting for its predecessor `id`'s death, if any.
  bool Waiting(int id) const;
  // Worker `id` is awaited (dead, may come back) and its successor
  // registered: the successor takes the id. `tell` are the live members,
  // which the caller sends NODE_JOINED naming `node`. Returns the
  // successor (its id and rank set) and its connection's temporary id.
  struct Started {
    NodeInfo node;
    int temp_id = 0;
    bool complete = false;  // nobody to tell: Finish now
  };
  Started Start(int id, const std::vector<int>& tell, Clock::time_point now);

  // Member `member` answered NODE_JOINED about `about`.
  enum class Answer {
    kUnexpected,  // no rejoin of that node awaits this answer: drop it
    kWaiting,     // others are still to answer
    kComplete,    // the last one: Finish
  };
  Answer Answered(int member, const NodeInfo& about);

  // Node `id` was lost (`from`: its state before). Fills *complete with
  // the started rejoins that waited only for its answer (Finish each), and
  // returns whether `id`'s own waiting registration may start now
  // (`awaited`: it may come back). A successor lost while rejoining is
  // forgotten.
  bool OnLost(int id, bool was_rejoining, bool awaited,
              std::vector<int>* complete);

  // The connection with temporary id `temp_id` closed: a registration
  // waiting on it is forgotten (a next restart is no second one). Returns
  // the worker id it restarted, -1 if none; *node: its address.
  int OnConnectionLost(int temp_id, NodeInfo* node);

  // The rejoin of `id` is complete: forgets it; returns the seconds since
  // its successor registered.
  double Finish(int id, Clock::time_point now);

  // Timer. *overdue: started rejoins whose members did not all answer
  // within `answer_ms` (they go ahead: Finish), with the silent members.
  // *refused: registrations whose predecessor is still alive after
  // `death_ms` (forgotten here; the caller refuses them).
  struct Overdue {
    int id;
    std::vector<int> silent;
  };
  struct Refused {
    int id;
    int temp_id;
    NodeInfo node;
  };
  void Tick(Clock::time_point now, int64_t answer_ms, int64_t death_ms,
            std::vector<Overdue>* overdue, std::vector<Refused>* refused);

  size_t size() const { return rejoins_.size(); }

 private:
  struct Rejoin {
    NodeInfo node;
    int temp_id = 0;  // its connection's id until it takes the worker's
    bool started = false;
    std::set<int> pending;         // members yet to answer NODE_JOINED
    Clock::time_point since;       // it registered
    Clock::time_point started_at;  // the members were told
  };

  const int num_workers_;
  const int max_restarts_;
  std::map<int, Rejoin> rejoins_;  // by the id of the worker restarted
};

}  // namespace core
}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_REJOIN_COORDINATOR_H_
