// NodeProtocol: the control protocol of one node (liveness, the judging of
// a death and its verdict, barriers, goodbyes) as one state machine
// without I/O, in the shape of etcd's raft RawNode. Its inputs are the
// proven control messages of its peers, a connection lost, a timer tick
// with the time, and this node's own barrier; each step returns what to do
// (Output): messages to send, the membership's events, drops to count,
// lines to log, whether the routes snapshot must be published again.
//
//   Postoffice (sockets, threads,        NodeProtocol (state, no I/O)
//   customers)
//   HEARTBEAT, BARRIER, NODE_FAILED,
//   TERMINATE, a lost connection,  --->  membership, node table,
//   a tick, Barrier(group)               barrier coordinator and waits
//                                  <---  Output: messages, events, drops,
//   sends, publishes routes,             log lines, routes changed
//   delivers events to subscribers
//
// The scheduler judges a death (Verdict: lose, await back, or covered by
// a named server) and sends its verdict as data in NODE_FAILED; members
// apply it as it is. tests/core/protocol_sim_test.cc runs whole clusters of
// these objects from scripts, without sockets, against golden output.
//
// Thread-compatible: one owner serializes every call (the Postoffice holds
// its mu_); the membership inside keeps its own lock for readers that hold
// none (the metrics scrape).
#ifndef PS_SRC_POSTOFFICE_NODE_PROTOCOL_H_
#define PS_SRC_POSTOFFICE_NODE_PROTOCOL_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "postoffice/barrier_coordinator.h"
#include "postoffice/barrier_waits.h"
#include "postoffice/membership.h"
#include "postoffice/node_table.h"
#include "postoffice/rejoin_coordinator.h"
#include "postoffice/takeover_coordinator.h"
#include "ps/config.h"
#include "ps/status.h"
#include "van/message.h"

namespace ps {
namespace core {

class NodeProtocol {
 public:
  using Clock = std::chrono::steady_clock;

  // What a step asks of its owner, in this order: count the drops, send
  // the messages, publish the routes if they changed, log the lines, then
  // deliver the events to the membership's subscribers.
  struct Output {
    struct Drop {
      Drop(int sender, std::string why, std::string connection = "")
          : sender(sender),
            why(std::move(why)),
            connection(std::move(connection)) {}
      int sender;
      std::string why;
      // Where it came from when its sender is not proven (else "").
      std::string connection;
    };
    struct Line {
      enum Level { kInfo, kTell, kWarning, kError };
      Level level;  // kTell: for the person running the job (Tell)
      std::string text;
    };
    struct Rekey {
      int from;
      int to;
    };
    std::vector<Drop> drops;
    // Connections to change, under the owner's lock, before anything is
    // sent: the ids to disconnect (a dead process's), registrations' ids
    // to rekey (a temporary id becomes the node's), and nodes to connect
    // to afresh (a restarted worker, a member reporting to a restarted
    // scheduler).
    std::vector<int> disconnect;
    std::vector<Rekey> rekey;
    std::vector<NodeInfo> connect;
    std::vector<Message> messages;
    // A node entered or left the down set: the data path's fence moved.
    bool routes_changed = false;
    std::vector<Line> lines;
    std::vector<PeerEvent> events;
    // Sent once the events are delivered (the answer to NODE_JOINED: the
    // KV layer forgets the old process's requests first).
    std::vector<Message> after_events;
  };

  // What becomes of a node declared dead: the input the membership takes
  // (kAwait, kCover or kLose) and, for kCover, the server that takes over.
  struct Verdict {
    PeerInput input = PeerInput::kLose;
    int by = -1;
  };

  explicit NodeProtocol(const Config& config);
  NodeProtocol(const NodeProtocol&) = delete;
  NodeProtocol& operator=(const NodeProtocol&) = delete;

  // ---- State that rendezvous and restarts (the Postoffice's rendezvous.cc
  // and rejoin.cc) set up.
  NodeTable& table() { return table_; }
  const NodeTable& table() const { return table_; }
  Membership& membership() { return membership_; }
  const Membership& membership() const { return membership_; }
  BarrierWaits& barrier_waits() { return barrier_waits_; }
  int self() const { return self_; }
  void set_self(int id);
  // A member with its node table (the scheduler: its rendezvous is done).
  bool ready() const { return ready_; }
  void set_ready() { ready_ = true; }
  // This node called Finalize: the scheduler may end first.
  bool finalized() const { return finalized_; }
  void set_finalized() { finalized_ = true; }
  // The first peer lost for good (PeerFailed), or OK.
  const Status& peer_failure() const { return peer_failure_; }

  // ---- Inputs.
  // Scheduler: its own entry, live from the start.
  void RegisterSelf(const NodeInfo& me, Clock::time_point now);
  // Scheduler: every member registered and has its rank and id: the table
  // takes them, each is watched from `now` and sent the node table, and
  // the job runs (ready).
  void AdmitAll(const std::vector<NodeInfo>& assigned, Clock::time_point now,
                Output* out);
  // Member: the scheduler's node table `table` (ids `dead` dead by then),
  // this node being `me`: the membership as the job stands, without events
  // (news to nobody here). Ready after.
  void Import(NodeTable table, const std::vector<int>& dead, int me,
              Clock::time_point now);
  // The monitor starts at `now`: a member watches the scheduler from then.
  void Start(Clock::time_point now);
  // A message of `sender` arrived at `now` on the connection that proves
  // it. Returns whether its data are fenced (a node declared dead is out
  // of the job); a heartbeat of such a node is answered with its death.
  bool OnProven(int sender, pb::Command cmd, Clock::time_point now,
                Output* out);
  // Whether this protocol takes control messages of `cmd`: HEARTBEAT,
  // BARRIER, NODE_FAILED, TERMINATE and NODE_JOINED.
  static bool Takes(pb::Command cmd);
  // One of them, its sender proven (after OnProven, unless that answered
  // it).
  void OnControl(const pb::Meta& m, Clock::time_point now, Output* out);
  // The connection to node `id` was lost for good (the watch's grace ran
  // out): a member, at the scheduler; the scheduler, at a member.
  void OnConnectionLost(int id, const std::string& why, Clock::time_point now,
                        Output* out);
  // The monitor's timer, at `now`: suspicion and deaths of silent peers,
  // heartbeats (members), restarts not back in time, barrier timeouts and
  // the reports of long waits.
  void Tick(Clock::time_point now, Output* out);
  // This node enters `group`'s barrier: Released(ticket) once answered.
  BarrierWaits::Ticket EnterBarrier(int group, Clock::time_point now,
                                    Output* out);
  // Each of `ids` is dead for `why`: the scheduler judges and tells every
  // member; a member (its connection to the scheduler lost) judges alone.
  void DeclareDead(const std::vector<int>& ids, const std::string& why,
                   Clock::time_point now, Output* out);
  // Takes node `id` by `input` (membership.h); false if the membership
  // refused it. The events go to out->events.
  bool Transition(int id, PeerInput input, const std::string& why,
                  Clock::time_point now, Output* out, int by = -1,
                  const Status& status = Status::OK());

  // ---- Restarts (node_protocol_restarts.cc; PS_MAX_RESTARTS).
  // Scheduler: why `node`, registering while the job runs, may not restart
  // a worker of it; OK if it may.
  Status CheckRestart(const NodeInfo& node) const;
  // Scheduler: `node` (checked; node.id is its connection's temporary id)
  // restarts a worker: returns that worker's id. Its rejoin starts once the
  // worker is awaited (*started; the connection is then the worker's id),
  // else when it is declared dead.
  int RegisterRestart(const NodeInfo& node, Clock::time_point now,
                      bool* started, Output* out);
  // Scheduler, restarted: member `node` reports itself (ADD_NODE with
  // rejoin; `covered`: the servers it knows taken over; `servers` and
  // `workers`: its job's shape; `running`: registrations arrived here).
  // `connection` names where it came from (its sender is not proven).
  void OnReport(const NodeInfo& node, const std::vector<NodeInfo>& covered,
                int servers, int workers, bool running,
                const std::string& connection, Clock::time_point now,
                Output* out);
  // Scheduler, restarted: the reports so far (for the lines of its wait).
  const TakeoverCoordinator& takeover() const { return takeover_; }
  // Member: the scheduler answered this node's report (a restarted one
  // took the job over, or one that lost the connection for a moment).
  void OnSchedulerBack(Clock::time_point now, Output* out);
  // Whether this node rejoined a running job (a restarted worker; a
  // restarted scheduler that took the job over).
  bool rejoined() const { return rejoined_; }
  void set_rejoined() { rejoined_ = true; }

  // ---- Queries.
  // How often Tick wants to run (0: never), in ms.
  int tick_ms() const { return tick_ms_; }
  // The verdict on `id` as this node sees the job.
  Verdict VerdictOf(int id) const;
  // Member: whether the scheduler is dead and not awaited back.
  bool SchedulerGone() const {
    return membership_.state(kSchedulerId) == PeerState::kDead;
  }
  // Member: the line of a wait in `group`'s barrier `waited` ms long (the
  // scheduler's is its coordinator's: "").
  std::string BarrierWaitLine(int group, int64_t waited) const;
  // Scheduler, finalizing: the members that have neither said goodbye nor
  // died, by name ("" if none).
  std::string Staying() const;
  // Member: the message that reports this node to a restarted scheduler.
  Message ReportToScheduler() const;
  // A control message of this node's.
  static Message ControlMessage(pb::Command cmd, int recver, bool request);
  // How long a control wait waits between reports of itself: a few
  // heartbeat timeouts, at least 100 ms.
  static int64_t ReportEveryMs(const Config& config);

 private:
  bool IsScheduler() const { return config_.role == Role::kScheduler; }
  // Every input starts here: the time of what follows.
  void At(Clock::time_point now) {
    now_ = now;
    membership_.Advance(now);
  }
  bool Apply(int id, PeerInput input, const std::string& why, Output* out,
             int by = -1, const Status& status = Status::OK());
  void Declare(const std::vector<int>& ids, const std::string& why,
               Output* out);
  void OnHeartbeat(const pb::Meta& m, Output* out);
  void OnBarrier(const pb::Meta& m, Clock::time_point now, Output* out);
  void OnNodeFailed(const pb::Meta& m, Output* out);
  void OnGoodbye(const pb::Meta& m, Output* out);
  // NODE_JOINED: a member's answer (scheduler), the scheduler's news of a
  // restarted worker (member).
  void OnJoined(const pb::Meta& m, Output* out);
  void OnNodeJoined(const pb::Meta& m, Output* out);
  // Scheduler: worker `id` is awaited and its successor registered: the
  // live members are told; once all answered, FinishRejoin.
  void StartRejoin(int id, Output* out);
  // Scheduler: the successor of `id` gets the node table and is live.
  void FinishRejoin(int id, Output* out);
  // Scheduler: the restarts that event `e` (lost or covered) concerns.
  void RejoinsOnEvent(const PeerEvent& e, Output* out);
  // Scheduler, each tick: rejoins overdue, restarts refused.
  void RejoinTick(Clock::time_point now, Output* out);
  // Scheduler, restarted: every member of the running job reported itself
  // (they are in the table, joining): each is admitted, watched and
  // answered, and the servers they report taken over (`covered`) enter the
  // table covered by their replica. Ready after.
  void TakeOver(const std::vector<NodeInfo>& covered, Output* out);
  // Scheduler, restarted, each tick: once a majority of the job reported
  // and the others stayed silent for the heartbeat timeout since the first
  // report, it takes the job over from those that did and declares the
  // others dead (a member that died while no scheduler was up to judge
  // it), each with the verdict a death gets.
  void TakeoverTick(Clock::time_point now, Output* out);
  // Whether a death of node `id` may be undone by a restart: a worker's,
  // or (at a member) the scheduler's.
  bool Restartable(int id) const;
  // The server that holds server `id`'s keys once it is dead, or -1.
  int CoveringServer(int id) const;
  // NODE_FAILED of `id` with `verdict`, to every member still in the job.
  void SendNodeFailed(int id, const std::string& why, const Verdict& verdict,
                      Output* out) const;
  // Node `id` failed, for `why`: the membership's transition by `verdict`.
  void ApplyVerdict(int id, const std::string& why, const Verdict& verdict,
                    Output* out);
  // Scheduler: the barriers that events [first, end) of out->events
  // release or fail.
  void ReactToEvents(size_t first, Output* out);
  void AnswerBarriers(const std::vector<BarrierCoordinator::Release>& releases,
                      Output* out);
  // Scheduler, each tick (the last at `prev`): restarts overdue, barriers
  // timed out, and the reports of long waits.
  void SchedulerTick(Clock::time_point prev, Clock::time_point now,
                     std::vector<int>* not_back, Output* out);
  // Member, each tick: its heartbeat, or its report while the scheduler is
  // awaited back.
  void MemberTick(Clock::time_point prev, Clock::time_point now,
                  std::vector<int>* not_back, Output* out);
  // Scheduler, each tick with members `silent` past the timeout or while
  // it withholds verdicts: whether it judges their silence now. That needs
  // a majority of the job heard (itself and the watched members neither
  // suspected nor silent, of itself and every watched member). When it
  // does not hear one, it says so (then once per report period) and
  // nobody's silence is judged. On the tick it does again it says that
  // too, and every member's silence counts from then: the silence it took
  // for its own link's is not held against the ones still unheard (a
  // member frozen with the others may thaw a moment after them).
  bool JudgesSilence(const std::vector<int>& silent, Clock::time_point prev,
                     Clock::time_point now, Output* out);
  // Member, losing the scheduler: says that it may be the one cut off
  // when it heard another peer within half the heartbeat timeout.
  void SayIfCutOff(Clock::time_point now, Output* out) const;
  // The scheduler's count behind that rule, with `unheard` counted silent:
  // whether it hears a majority, and the line that says how many it hears.
  bool HearsMajority(const std::vector<int>& unheard, std::string* count,
                     std::string* silent) const;
  // Whether a report of a wait since `since` falls due in (prev, now].
  bool ReportDue(Clock::time_point since, Clock::time_point prev,
                 Clock::time_point now) const;

  const Config config_;
  int tick_ms_ = 0;
  int self_ = 0;
  bool ready_ = false;
  bool finalized_ = false;
  NodeTable table_;
  Membership membership_;
  BarrierCoordinator barriers_;
  RejoinCoordinator rejoins_;       // scheduler: restarted workers rejoining
  TakeoverCoordinator takeover_;    // scheduler, restarted: members' reports
  Clock::time_point first_report_;  // of the takeover
  bool rejoined_ = false;
  Clock::time_point now_;  // the time of the input being taken
  BarrierWaits barrier_waits_;
  Status peer_failure_;
  Clock::time_point last_tick_;
  Clock::time_point last_heartbeat_;
  // Member: the last peer other than the scheduler heard from, and when
  // (a member that loses the scheduler while it hears it is cut off).
  int last_peer_ = -1;
  Clock::time_point last_peer_at_;
  // Scheduler: verdicts on silence withheld for want of a quorum, since.
  bool withholding_ = false;
  Clock::time_point withheld_since_;
};

}  // namespace core
}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_NODE_PROTOCOL_H_
