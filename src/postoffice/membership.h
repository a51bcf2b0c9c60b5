// Membership: every node's state (joining, live, suspected, dead, ...) in
// one table, changed only by the legal transitions of kPeerTransitions, each
// logged once naming the node by role and rank and the reason (INFO; joining
// and admission, N * N of them at start, VLOG(1)). The rest of
// the node learns of changes as typed events (PeerJoined, PeerLost,
// PeerCovered, PeerRejoined, PeerDeparted) through one subscription.
//
// A deterministic state machine in the shape of etcd's raft: its inputs are
// transitions (from control messages) and timer ticks (Tick, Heard), its
// outputs the events; it does no I/O, so tests feed it inputs.
//
// Thread-safety: every method may be called from any thread; one internal
// mutex guards the table and the subscribers. Apply and Tick only append
// the events they cause to the caller's list: the caller delivers them with
// Publish once it holds no lock (its own included), so that no subscriber
// ever runs under a lock. Publish calls the subscribers on the calling
// thread, in the order they subscribed, one event after the other.
#ifndef PS_SRC_POSTOFFICE_MEMBERSHIP_H_
#define PS_SRC_POSTOFFICE_MEMBERSHIP_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "ps/base.h"
#include "ps/status.h"
#include "van/sync.h"

namespace ps {
namespace core {

// A node's state as this node sees it.
enum class PeerState : uint8_t {
  kAbsent,     // not in the table (never a transition's target)
  kJoining,    // registered, not yet admitted to the job
  kLive,       // in the job and heard from in time
  kSuspected,  // live but silent past half the heartbeat timeout
  kAwaited,    // dead, awaited back under its id (PS_MAX_RESTARTS)
  kDead,       // dead for good
  kCovered,    // a dead server whose replica took its keys (PS_REPLICAS)
  kRejoining,  // an awaited node's successor registered, is being admitted
  kDeparted,   // said goodbye (Finalize): gone without blame; final
};

// What happens to a node: the input of a transition.
enum class PeerInput : uint8_t {
  kRegister,  // it appears (rendezvous, a node table, a report)
  kAdmit,     // the job takes it (ranks assigned, the table complete)
  kSilent,    // a tick found it silent past the suspicion threshold
  kHeard,     // a suspected node was heard from again
  kAwait,     // it died, and may come back (PS_MAX_RESTARTS)
  kLose,      // it died for good (or an awaited one did not come back)
  kCover,     // it died and its replica holds its keys
  kRejoin,    // an awaited node's successor registered
  kRejoined,  // it (its successor) is back in the job
  kDepart,    // it said goodbye
};

const char* PeerStateName(PeerState state);
const char* PeerInputName(PeerInput input);

struct PeerTransition {
  PeerState from;
  PeerInput input;
  PeerState to;
};

// The legal transitions, all of them; any other (state, input) is refused.
inline constexpr PeerTransition kPeerTransitions[] = {
    {PeerState::kAbsent, PeerInput::kRegister, PeerState::kJoining},
    {PeerState::kJoining, PeerInput::kAdmit, PeerState::kLive},
    {PeerState::kJoining, PeerInput::kAwait, PeerState::kAwaited},
    {PeerState::kJoining, PeerInput::kLose, PeerState::kDead},
    {PeerState::kJoining, PeerInput::kCover, PeerState::kCovered},
    {PeerState::kLive, PeerInput::kSilent, PeerState::kSuspected},
    {PeerState::kLive, PeerInput::kAwait, PeerState::kAwaited},
    {PeerState::kLive, PeerInput::kLose, PeerState::kDead},
    {PeerState::kLive, PeerInput::kCover, PeerState::kCovered},
    {PeerState::kLive, PeerInput::kDepart, PeerState::kDeparted},
    {PeerState::kSuspected, PeerInput::kHeard, PeerState::kLive},
    {PeerState::kSuspected, PeerInput::kAwait, PeerState::kAwaited},
    {PeerState::kSuspected, PeerInput::kLose, PeerState::kDead},
    {PeerState::kSuspected, PeerInput::kCover, PeerState::kCovered},
    {PeerState::kSuspected, PeerInput::kDepart, PeerState::kDeparted},
    {PeerState::kAwaited, PeerInput::kLose, PeerState::kDead},
    {PeerState::kAwaited, PeerInput::kRejoin, PeerState::kRejoining},
    {PeerState::kAwaited, PeerInput::kRejoined, PeerState::kLive},
    {PeerState::kDead, PeerInput::kCover, PeerState::kCovered},
    {PeerState::kRejoining, PeerInput::kRejoined, PeerState::kLive},
    {PeerState::kRejoining, PeerInput::kAwait, PeerState::kAwaited},
    {PeerState::kRejoining, PeerInput::kLose, PeerState::kDead},
};

// The state `input` takes a node in `from` to; kAbsent if it is illegal.
constexpr PeerState NextPeerState(PeerState from, PeerInput input) {
  for (const PeerTransition& t : kPeerTransitions) {
    if (t.from == from && t.input == input) return t.to;
  }
  return PeerState::kAbsent;
}

// A change the rest of the node reacts to. Entering kSuspected, leaving it
// for kLive and kJoining are no events (nobody acts on them).
struct PeerEvent {
  enum Kind : uint8_t {
    kPeerJoined,    // admitted: kJoining -> kLive
    kPeerLost,      // -> kAwaited (awaited() true) or -> kDead
    kPeerCovered,   // -> kCovered: `by` holds its keys
    kPeerRejoined,  // kAwaited or kRejoining -> kLive
    kPeerDeparted,  // -> kDeparted
    // Not a transition: this node itself stopped (id -1), to its
    // customers, so that every wait on a peer ends.
    kStopped,
  };
  Kind kind;
  int id;
  PeerState from;
  PeerState to;
  std::string why;  // the transition's reason, as logged
  int by = -1;      // kPeerCovered: the id of the replica holding its keys
  // kPeerLost, kPeerCovered: the failure as the caller of Apply put it for
  // those who wait on the node (e.g. PeerFailed naming its address).
  Status status;

  // kPeerLost: whether the node may yet come back (PS_MAX_RESTARTS).
  bool awaited() const { return to == PeerState::kAwaited; }
  // What a failure handle is told of a lost, covered or stopped node: the
  // status, as Unavailable while the node is awaited back (a DenseShard
  // keeps waiting for it), PeerFailed once it is dead for good.
  Status Told() const {
    return awaited() ? Status::Unavailable(status.message() +
                                           "; awaited back (PS_MAX_RESTARTS)")
                     : status;
  }
};

const char* PeerEventName(PeerEvent::Kind kind);

class Membership {
 public:
  using Clock = std::chrono::steady_clock;
  using Subscriber = std::function<void(const PeerEvent&)>;

  Membership() = default;
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Names this node in the log lines ("server 1: worker 0 live -> dead:
  // ..."); until set, the lines name no node.
  void set_self(int self) EXCLUDES(mu_);

  // Takes node `id` from its state by `input` if that is legal (appending
  // the event it causes, if any, to *events), else refuses it with
  // InvalidArgument naming the node, its state and the input, and changes
  // nothing. `why` is logged and carried by the event, with `by` (the
  // replica of kCover) and `status`. Inputs from the network are refused,
  // never fatal.
  Status Apply(int id, PeerInput input, const std::string& why,
               std::vector<PeerEvent>* events, int by = -1,
               const Status& status = Status::OK()) EXCLUDES(mu_);

  // Delivers `events`, in order, to every subscriber. The caller holds no
  // lock. Events a subscriber publishes while it reacts (on this thread)
  // are delivered after the one it reacts to has reached every subscriber,
  // so that all see the same order.
  void Publish(const std::vector<PeerEvent>& events) EXCLUDES(mu_);
  // Adds a subscriber for every later Publish; returns its handle. A
  // subscriber may call any method of this class.
  int Subscribe(Subscriber subscriber) EXCLUDES(mu_);
  // Later Publish calls skip it; one running now still finishes.
  void Unsubscribe(int handle) EXCLUDES(mu_);

  // The time of the inputs that follow: Apply stamps each transition with
  // it (since). Until called, the steady clock's time.
  void Advance(Clock::time_point now) EXCLUDES(mu_);

  // Liveness. Heard: a message of `id` arrived at `now` (a suspected node
  // is live again). Watch: from `now` on, `id`'s silence counts (heartbeats
  // to the scheduler; the scheduler at a member). ForgiveSilence: this node
  // itself was stalled; nobody's silence until `now` counts.
  void Watch(int id, Clock::time_point now) EXCLUDES(mu_);
  void Heard(int id, Clock::time_point now) EXCLUDES(mu_);
  void ForgiveSilence(Clock::time_point now) EXCLUDES(mu_);
  // This node was stalled for `stalled` (its timer fired that late): that
  // much of everyone's silence is its own, not theirs (not past `now`).
  void ExcuseStall(Clock::duration stalled, Clock::time_point now)
      EXCLUDES(mu_);
  // Timer tick: a watched node (live or suspected) silent for
  // longer than `suspect_after` becomes suspected; returns those silent for
  // longer than `dead_after` (the caller declares them dead).
  std::vector<int> Tick(Clock::time_point now, Clock::duration suspect_after,
                        Clock::duration dead_after) EXCLUDES(mu_);

  // Queries.
  PeerState state(int id) const EXCLUDES(mu_);
  // When `id` entered its state; Clock::time_point() if absent.
  Clock::time_point since(int id) const EXCLUDES(mu_);
  // Awaited, dead or covered: not in the job now.
  bool IsDown(int id) const EXCLUDES(mu_);
  // The nodes IsDown holds for, ascending by id: the state, who covers it, and
  // why it went down (the status of the input that took it there, or one made
  // of its reason).
  struct DownPeer {
    int id;
    PeerState state;
    int covered_by;  // kCovered: the replica holding its keys; else -1
    Status why;
  };
  std::vector<DownPeer> Down() const EXCLUDES(mu_);
  // The ids in `state`, ascending.
  std::vector<int> InState(PeerState state) const EXCLUDES(mu_);
  // How many nodes are in any of `states`.
  int Count(std::initializer_list<PeerState> states) const EXCLUDES(mu_);
  // Every node but this one: its state, and when it was last heard from
  // (meaningful for watched nodes only: `watched`).
  struct PeerView {
    int id;
    PeerState state;
    bool watched;
    Clock::time_point last_heard;
  };
  std::vector<PeerView> Peers() const EXCLUDES(mu_);
  // Forgets every node (a node table replaces what came before).
  void Clear() EXCLUDES(mu_);

 private:
  struct Record {
    PeerState state = PeerState::kAbsent;
    std::string reason;
    int by = -1;    // kCovered: the replica holding its keys
    Status status;  // of the input that took it to its state
    Clock::time_point since;
    Clock::time_point last_heard;
    bool watched = false;
  };
  std::string SelfLocked() const REQUIRES(mu_);

  mutable Mutex mu_;
  int self_ GUARDED_BY(mu_) = 0;
  bool advanced_ GUARDED_BY(mu_) = false;
  Clock::time_point now_ GUARDED_BY(mu_);
  std::map<int, Record> nodes_ GUARDED_BY(mu_);
  int next_handle_ GUARDED_BY(mu_) = 0;
  std::map<int, Subscriber> subscribers_ GUARDED_BY(mu_);
};

}  // namespace core
}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_MEMBERSHIP_H_
