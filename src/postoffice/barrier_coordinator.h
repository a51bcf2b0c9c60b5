// BarrierCoordinator: the scheduler's side of the barrier protocol, as a
// state machine. Inputs: a member's arrival (BARRIER request), the
// membership's events and timer ticks; output: the barriers to release,
// each with its status and the members to answer. No I/O: the Postoffice
// turns a Release into BARRIER answers, and tests feed it inputs.
//
//   member                      scheduler
//   BARRIER request (group) ->  Arrive: every member of the group arrived
//                               (a server taken over is not waited for)
//   <- BARRIER response         Release (OK, or why it cannot complete:
//                               a member lost for good, the timeout)
//
// While a barrier waits, Reports() names who it waits for once per report
// interval (a few heartbeat timeouts): a barrier may rightly wait long for
// a slow member, but never without a word.
//
// Thread-compatible: its owner serializes the calls (the Postoffice holds
// its mu_); the functions of Members are called inside them.
#ifndef PS_SRC_POSTOFFICE_BARRIER_COORDINATOR_H_
#define PS_SRC_POSTOFFICE_BARRIER_COORDINATOR_H_

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "postoffice/membership.h"
#include "ps/status.h"

namespace ps {
namespace core {

class BarrierCoordinator {
 public:
  using Clock = std::chrono::steady_clock;

  // What it asks of the node: who is in a group (the node table), each
  // one's state (the membership) and its name for messages.
  struct Members {
    std::function<std::vector<int>(int group)> ids;
    std::function<PeerState(int id)> state;
    std::function<std::string(int id)> describe;
  };
  // A barrier done: answer `arrived` with `status`.
  struct Release {
    int group;
    Status status;
    std::vector<int> arrived;
  };

  // A barrier still waiting, one report interval more since the last.
  struct Report {
    int group;
    int64_t waited_ms;  // since the first arrival
    std::string line;   // "barrier of workers: waiting 10.0 s for worker 1"
  };

  // timeout_ms: PS_BARRIER_TIMEOUT_MS, from the first arrival; report_ms:
  // the interval of Reports() (> 0).
  BarrierCoordinator(Members members, int timeout_ms, int64_t report_ms)
      : members_(std::move(members)),
        timeout_ms_(timeout_ms),
        report_ms_(report_ms) {}

  // Member `sender` of `group` arrived (the caller checked that it is one).
  std::vector<Release> Arrive(int group, int sender, Clock::time_point now);
  // A member lost for good fails the barriers it is needed in; one taken
  // over is waited for no more.
  std::vector<Release> OnPeerEvent(const PeerEvent& e);
  // Barriers past their timeout fail, naming who is missing.
  std::vector<Release> Tick(Clock::time_point now);
  // The barriers waiting for another report_ms since their last report
  // (or their first arrival), each naming who has not arrived.
  std::vector<Report> Reports(Clock::time_point now);
  // Whether a barrier of `group` is waiting.
  bool waiting(int group) const { return barriers_.count(group) > 0; }
  // The members of waiting `group` that have not arrived and are waited
  // for, by name, with their state when it is suspected, awaited,
  // rejoining or dead: "server 1, worker 0 (awaited)"; "" if none.
  std::string Missing(int group) const;

 private:
  struct Barrier {
    std::set<int> arrived;
    Clock::time_point started;
    Clock::time_point reported;  // the last report, or started
  };
  bool Complete(int group) const;
  Release Take(int group, const Status& status);

  const Members members_;
  const int timeout_ms_;
  const int64_t report_ms_;
  std::map<int, Barrier> barriers_;
};

}  // namespace core
}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_BARRIER_COORDINATOR_H_
