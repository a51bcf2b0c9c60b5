// Postoffice: the state machine of one node behind ps::Node. It owns the
// van, the node table, the membership (every node's state: membership.h),
// rendezvous, barriers, heartbeats and the dispatch of data messages to the
// KV layer's customers. A change of a node's state is a transition of the
// membership; barriers, the rejoin protocol, the KV layer and the user's
// failure handler learn of it as events (OnPeerEvent*).
//
// Threads (docs/threads.md): the van's receive thread runs OnMessage and
// every handler; the monitor thread "ps-monitor" sends heartbeats (members)
// or checks liveness and barrier deadlines (scheduler). Locks: mu_ guards
// the node state; customers_mu_ guards changes of the customer registry;
// the membership has its own, taken after mu_; none is held while a
// handler, subscriber or callback runs or while a message is sent.
//
// The data path takes none of them: Send reads this node's id from an
// atomic; a data message from a member is checked against routes_ (the
// node table as of its last change, an immutable snapshot) and handed to
// its customer found in customers_ (another snapshot), whose mailbox has
// the customer's own lock.
#ifndef PS_SRC_POSTOFFICE_POSTOFFICE_H_
#define PS_SRC_POSTOFFICE_POSTOFFICE_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "metrics/metrics.h"
#include "postoffice/membership.h"
#include "postoffice/node_protocol.h"
#include "postoffice/node_table.h"
#include "postoffice/rendezvous_coordinator.h"
#include "postoffice/resender.h"
#include "postoffice/routes.h"
#include "ps/config.h"
#include "ps/status.h"
#include "van/message.h"
#include "van/snapshot.h"
#include "van/sync.h"
#include "van/van.h"

namespace ps {

// Writes "ps-event: JSON" on stderr, whatever glog's settings: the
// scheduler's machine-readable lines for the launcher (tracker/ps_tracker,
// docs/architecture.md "Launcher events").
void PrintEvent(const std::string& json);
// `text` as a JSON string, quoted and escaped (for PrintEvent).
std::string JsonString(const std::string& text);

// In namespace core: ps::Postoffice is the ps-lite facade
// (include/ps/internal/postoffice.h), which internal code never includes.
namespace core {

class Postoffice {
 public:
  using Clock = std::chrono::steady_clock;
  // Gets each data message for a customer; runs on the receive thread.
  using DataHandler = std::function<void(Message&& msg)>;
  // Told of the membership's events that concern a customer: a node lost
  // (PeerEvent::Told: Unavailable while awaited back, PeerFailed for
  // good), covered by its replica, or rejoined (a restarted worker, at
  // members: later messages of that id come from the new process; told
  // before the new process may send to this node), and this node's own
  // stop (kStopped). Receive, monitor, watch or caller thread, never under
  // a lock; Postoffice::routes() already holds the change.
  using EventHandler = std::function<void(const PeerEvent& event)>;
  // Called by the monitor thread every few hundred ms at most (resends);
  // never under a lock.
  using TickHandler = std::function<void(Clock::time_point now)>;

  explicit Postoffice(const Config& config);
  ~Postoffice();

  Status Bind();
  Status Start();
  Status Barrier(int group);
  Status Finalize(bool do_barrier);
  void Stop();
  // Stops without telling the scheduler, as a crashed process would (tests).
  void Abandon();

  const Config& config() const { return config_; }
  int id() const;
  int rank() const;
  int port() const { return van_.port(); }
  std::vector<int> GetNodeIds(int group) const;
  std::string DescribeNode(int id) const;
  uint64_t num_dropped() const { return van_.num_dropped(); }
  uint64_t num_refused() const { return van_.num_refused(); }
  const Van& van() const { return van_; }
  // Shared memory, through the transport (van/shm.h): where `bytes` at `p`
  // lie in this process's shared memory, if they do; and the bytes a
  // reference of a peer's (checked by the van on receipt) names.
  bool FindShared(const void* p, size_t bytes, pb::SharedRef* ref) const;
  StatusOr<SArray<char>> ResolveShared(const pb::SharedRef& ref,
                                       size_t bytes) const;
  Status peer_failure() const;
  // The node table and who is down, as of the last change (routes.h):
  // lock-free, never null; published before that change's events.
  std::shared_ptr<const Routes> routes() const { return routes_.Load(); }
  // Replication: whether dead server `id`'s keys were taken over by its
  // replica (the job goes on without it).
  bool TakenOver(int id) const { return routes()->ServerOf(id) != id; }
  // Whether this node rejoined a running job (a restarted worker, see
  // PS_MAX_RESTARTS): it skips the start barrier the others passed.
  bool rejoined() const EXCLUDES(mu_);
  // handler(id, why): node `id` failed (Node::SetPeerFailureHandler).
  void SetPeerFailureHandler(
      std::function<void(int id, const Status& why)> handler);

  // KV layer. A server registers (true, app_id, -1) for requests; a worker
  // registers (false, app_id, customer_id) for responses.
  // A `paused` customer gets no request (those held for it included) until
  // ResumeCustomer; answers reach it as ever.
  void RegisterCustomer(bool requests, int app_id, int customer_id,
                        DataHandler on_data, EventHandler on_event,
                        TickHandler on_tick = nullptr, bool paused = false);
  // Hands a paused customer the requests that waited, on this thread unless
  // its deliverer runs (then on that one); later ones come as to any other.
  // No-op if it is not paused.
  void ResumeCustomer(bool requests, int app_id, int customer_id)
      EXCLUDES(customers_mu_);
  // Waits for a running handler of this customer to return (unless called
  // from inside it).
  void UnregisterCustomer(bool requests, int app_id, int customer_id);
  // A SimpleApp (ps/simple_app.h) of customer c registers
  // (false, app_id, SimpleAppCustomerId(c)) and gets the messages with
  // meta.simple_app set for that app and customer, from any member.
  static int SimpleAppCustomerId(int customer_id) { return -2 - customer_id; }
  // Sends msg to meta.recver(), stamping the sender. Any thread. A node
  // connects only to the peers it talks to (rendezvous); a SimpleApp
  // message to another member opens a connection to it first.
  Status Send(Message* msg) EXCLUDES(mu_);
  // Counts and logs a dropped message from node `sender`.
  void CountDropped(int sender, const std::string& why);
  // Counts a message received again (a resent request or its answer) and
  // let go; no log: after a loss they are expected.
  void CountDuplicate() {
    num_duplicates_.fetch_add(1);
    metrics_->Duplicate();
  }
  uint64_t num_duplicates() const { return num_duplicates_.load(); }
  // Counts a request sent again for want of an answer.
  void CountSent(const Message& msg) {
    num_sent_.fetch_add(1, std::memory_order_relaxed);
    metrics_->Sent(msg.meta.recver(), WireBytes(msg));
  }
  void CountResent() {
    num_resent_.fetch_add(1);
    metrics_->Resent();
  }
  uint64_t num_resent() const { return num_resent_.load(); }
  // The adaptive resend timer; null when resends use a fixed timer or none.
  const Resender* resender() const { return resender_.get(); }
  // Messages the test switch PS_DROP_MSG let go.
  uint64_t num_test_drops() const { return num_test_drops_.load(); }
  // Data messages of nodes declared dead, dropped (fenced).
  uint64_t num_fenced() const { return num_fenced_.load(); }
  // Messages this node sent (resends and acknowledgements included) and
  // received, of every kind.
  uint64_t num_sent() const { return num_sent_.load(); }
  uint64_t num_received() const { return num_received_.load(); }
  // This node's metrics (served on PS_METRICS_PORT when set); the KV layer
  // reports into them.
  Metrics& metrics() { return *metrics_; }

 private:
  // Data messages held before the node table (early_) or before their
  // KVServer registered (held_): at most this many, each.
  static constexpr size_t kMaxEarlyMessages = 10000;
  // What msg weighs on the wire, about: its header and its data frames.
  static uint64_t WireBytes(const Message& msg) {
    return msg.meta.ByteSizeLong() + MessageBytes(msg);
  }
  // The data bytes of msg (what the holding budgets count).
  static uint64_t MessageBytes(const Message& msg) {
    uint64_t bytes = 0;
    for (const SArray<char>& frame : msg.data) bytes += frame.size();
    return bytes;
  }

  using CustomerKey = std::tuple<bool, int, int>;
  struct Customer {
    DataHandler on_data;
    EventHandler on_event;
    TickHandler on_tick;
    Mutex mu;
    CondVar cv{&mu};
    // Messages not yet handled, whether a thread is draining them (handlers
    // of one customer never run concurrently), and which thread.
    std::deque<Message> mailbox GUARDED_BY(mu);
    bool delivering GUARDED_BY(mu) = false;
    std::thread::id deliverer GUARDED_BY(mu);
    bool closed GUARDED_BY(mu) = false;  // unregistered: takes no more
    // Paused: requests wait in `waiting` until ResumeCustomer (answers are
    // delivered as ever).
    bool paused GUARDED_BY(mu) = false;
    std::deque<Message> waiting GUARDED_BY(mu);
  };
  using CustomerMap = std::map<CustomerKey, std::shared_ptr<Customer>>;

  // Receive thread.
  void OnMessage(Message&& msg);
  // The acknowledgements of the adaptive resend timer (resender.h): takes
  // msg if it is one; acknowledges it if it asks.
  bool TakeAck(const Message& msg);
  // The test switch PS_DROP_MSG: whether to let this message go unread.
  bool DropForTest(const Message& msg);
  void OnControl(Message&& msg);
  // A data message whose sender routes_ proves; false if it takes the
  // slow path (control, not ready, the scheduler's, or not proven there).
  bool FastDispatch(Message* msg);
  void DispatchData(Message&& msg);
  // Puts msg in customer's mailbox and drains it unless another thread
  // does; false (msg untouched) if the customer was unregistered.
  bool Post(const std::shared_ptr<Customer>& customer, Message* msg);
  // Answers request `req` with an error (counted as a drop).
  void RefuseRequest(const Message& req, Status::Code code,
                     const std::string& why) EXCLUDES(mu_);
  // The customer msg is for: a request (and, at a server, the answer to a
  // message it forwarded for `origin`) to the app's server customer,
  // another answer to the customer that asked, SimpleApp's to its app.
  CustomerKey CustomerOf(const pb::Meta& m) const;
  // Connects to member `id` (unwatched) for a SimpleApp message, unless
  // connected to its present address; refuses a node that is down.
  Status ConnectForSimpleApp(int id) EXCLUDES(mu_);
  // What takes m's requests here, named for the lines that refuse them.
  std::string TakerOf(const pb::Meta& m) const;
  // Holds request *msg for `key`'s customer (true: taken), or lets a
  // resent copy of one held go (true); false if the budgets are spent.
  bool HoldLocked(const CustomerKey& key, Message* msg, Clock::time_point now)
      REQUIRES(customers_mu_);
  // No customer (registered) for msg: a request waits for its KVServer or
  // SimpleApp (held_), within budgets, else is refused; anything else is
  // dropped.
  void HoldOrDrop(const CustomerKey& key, Message&& msg)
      EXCLUDES(customers_mu_);
  // Refuses (NotFound) the requests held for a KVServer that has not
  // registered for longer than PS_CONNECT_TIMEOUT_MS. Any thread but under
  // no lock (monitor loop, DispatchData).
  void ExpireHeldRequests(Clock::time_point now) EXCLUDES(mu_, customers_mu_);
  // The customers registered now (to call their handlers under no lock).
  std::vector<std::shared_ptr<Customer>> Customers() EXCLUDES(customers_mu_);
  // Drains customer's mailbox on this thread; customer->delivering is set.
  void Deliver(const std::shared_ptr<Customer>& customer)
      EXCLUDES(customer->mu);
  // The registry as of its last change.
  std::shared_ptr<const CustomerMap> LoadCustomers() const {
    return customers_.Load();
  }
  // Publishes table_, my_id_ and the nodes down for the data path (after
  // each change).
  void PublishRoutesLocked() REQUIRES(mu_);

  // Rendezvous (rendezvous.cc).
  Status StartScheduler();
  Status StartMember();
  // Member: what it registers as (its address, key and shared-memory
  // probe).
  NodeInfo MyRegistration();
  // Member: waits for the scheduler's ACK of the registration `sent`
  // (me_line: "worker at ADDRESS has waited "); why none came.
  Status AwaitAckLocked(const Status& sent, const std::string& me_line)
      REQUIRES(mu_);
  // Member: waits a while for the SHM_READY answers of its domain's peers.
  void AwaitShmAnswersLocked() REQUIRES(mu_);
  // Scheduler: the line of a rendezvous (or a restarted scheduler's wait
  // for the members' reports) `waited` ms long, naming who is missing.
  std::string RendezvousWaitLineLocked(int64_t waited) const REQUIRES(mu_);
  // SharedMemory::Domain() when PS_SHM allows shared memory, else "".
  std::string MyShmDomain() const;
  // Maps the probe page of `peer` (of our domain); if that works, we accept
  // its references (Van::AcceptReferencesFrom) and return "", else why not
  // (logged). The caller tells the peer (SHM_READY with that error).
  std::string ProbeSharedMemory(const NodeInfo& peer);
  void SchedulerOnAddNode(const Message& msg);
  // Scheduler: the node an ADD_NODE registers, if it is well formed and
  // names the address its connection is named after (else counted, false).
  bool ReadRegistration(const Message& msg, NodeInfo* node);
  // Scheduler: why registration `node` (of `ctrl`) is refused, or OK;
  // *shape: why its job's shape is not this one's, or OK.
  Status RegistrationErrorLocked(const NodeInfo& node, const pb::Control& ctrl,
                                 bool token_ok, Status* shape) REQUIRES(mu_);
  // Scheduler: a registration refused with `st` (`shape`: whether its job's
  // shape is this one's) is answered; a shape that differs fails the
  // rendezvous for every node. Returns how many nodes were told it failed.
  int RefuseLocked(const NodeInfo& node, const Status& st, const Status& shape,
                   bool token_ok, std::vector<Message>* outbox) REQUIRES(mu_);
  // Scheduler: a registration taken: a restart of a running job's worker,
  // or an arrival at rendezvous (the last completes it). out->messages[0]
  // is its ACK.
  void TakeRegistrationLocked(const NodeInfo& node, NodeProtocol::Output* out)
      REQUIRES(mu_);
  // A restarted scheduler (PS_MAX_RESTARTS): the members of the running job
  // each report themselves (ADD_NODE with rejoin, their id and rank); once
  // all did, it knows the table and the job goes on.
  void SchedulerOnMemberReport(const Message& msg, const NodeInfo& node)
      EXCLUDES(mu_);
  // A restarted scheduler that took the running job over: the workers
  // that registered before (restarts, whose predecessors' run was this
  // job's) are registered as restarts now.
  void TakeHeldRestartsLocked(NodeProtocol::Output* out) REQUIRES(mu_);
  // Member: the scheduler we awaited is back; barriers in flight are sent
  // to it again.
  void MemberOnSchedulerBack() EXCLUDES(mu_);
  void MemberOnNodeTable(const Message& msg);
  // Member: connects to the peers of node table `table` it talks to (not
  // those in `dead`), and probes the shared memory of those of its domain
  // (*probed: each one's id and why it cannot be mapped, "" if it can).
  Status ConnectToPeersLocked(const NodeTable& table, const NodeInfo& me,
                              const std::set<int>& dead,
                              std::vector<std::pair<int, std::string>>* probed)
      REQUIRES(mu_);
  // Assigns ranks, rekeys the connections and adds one node table message
  // per member to out; *new_ids maps each temporary id to the assigned one.
  void CompleteRendezvousLocked(std::map<int, int>* new_ids,
                                NodeProtocol::Output* out) REQUIRES(mu_);

  // A control wait (rendezvous, a barrier, a restarted scheduler or
  // worker, the last goodbyes) says what it waits for once per this
  // interval (NodeProtocol::report_every_ms).
  int64_t ReportEveryMs() const { return NodeProtocol::ReportEveryMs(config_); }
  // Waits on cv_ until done() or `deadline`; each ReportEveryMs() meanwhile
  // logs report(ms waited) as a warning (nothing if it is ""). Returns
  // done().
  bool WaitReportingLocked(Clock::time_point deadline,
                           const std::function<bool()>& done,
                           const std::function<std::string(int64_t)>& report)
      REQUIRES(mu_);

  // Scheduler, finalizing: waits within the connect timeout for every
  // member's goodbye (TERMINATE) or death, then names those still there.
  void AwaitGoodbyes() EXCLUDES(mu_);

  // Monitor thread and failures.
  void MonitorLoop();
  // Runs the customers' tick handlers (resends). No lock held.
  void TickCustomers(Clock::time_point now) EXCLUDES(customers_mu_);
  // Watch thread: the connection to node `id` (a member, at the scheduler;
  // the scheduler, at a member) was lost for good.
  void OnConnectionLost(int id, const std::string& why) EXCLUDES(mu_);
  // Watch thread: the connection to node `id` was made again after it had
  // closed.
  void OnConnectionRegained(int id) EXCLUDES(mu_);
  // Before a scrape: each peer's state and heartbeat age into metrics_.
  void CollectPeerMetrics() const;
  // One line on stderr with the resend counters, when any is non-zero.
  void ReportResends() const EXCLUDES(mu_);
  // Each of `ids` is dead, for `why` (NodeProtocol::DeclareDead).
  void DeclareDead(const std::vector<int>& ids, const std::string& why)
      EXCLUDES(mu_);
  // After a step of protocol_, under mu_: changes the connections it asks
  // for (a restarted worker's: probing its shared memory too), publishes the
  // routes if they changed and wakes the waiters on cv_.
  void AfterStepLocked(NodeProtocol::Output* out) REQUIRES(mu_);
  // Then, under no lock: counts the drops, sends the messages, logs the
  // lines, publishes the events, then sends what waited for them.
  void Flush(NodeProtocol::Output* out) EXCLUDES(mu_);
  // Whether msg came on the connection of the node its header names (or,
  // before the node table, of the scheduler); else counts and drops it.
  bool SenderIsProvenLocked(const Message& msg) REQUIRES(mu_);
  // Whether msg (of a sender not yet known) may wait in early_ for the
  // node table: data or SHM_READY, within a count and a byte budget.
  bool MayHoldEarly(const Message& msg) const REQUIRES(mu_);
  // Takes node `id` by `input` (membership.h) and wakes the waiters on
  // cv_; false if the membership refused it.
  bool TransitionLocked(int id, PeerInput input, const std::string& why,
                        std::vector<PeerEvent>* events, int by = -1,
                        const Status& status = Status::OK()) REQUIRES(mu_);
  // The membership's subscribers (peer_events.cc), in the order they are
  // told: each reacts to the events that concern it, under no lock.
  // The line for the person running the job (and the launcher).
  void OnPeerEventForLog(const PeerEvent& e) const;
  // The KV layer: on_event for a lost or covered node, and for a rejoined
  // worker (members).
  void OnPeerEventForCustomers(const PeerEvent& e) EXCLUDES(customers_mu_);
  // The user's peer-failure handler: a node lost for good.
  void OnPeerEventForUser(const PeerEvent& e) EXCLUDES(mu_);
  void SendAll(std::vector<Message>* outbox) EXCLUDES(mu_);
  static Message ControlMessage(pb::Command cmd, int recver, bool request) {
    return NodeProtocol::ControlMessage(cmd, recver, request);
  }
  bool IsScheduler() const { return config_.role == Role::kScheduler; }

  const Config config_;
  // Before van_, which reports refusals into it.
  const std::unique_ptr<Metrics> metrics_;  // MakeMetrics(role)
  Van van_;
  bool bound_ = false;
  bool started_ = false;
  bool stopped_ = false;
  bool abandoned_ = false;
  SArray<char> shm_probe_;  // a page peers map to check they can (van/shm.h)

  mutable Mutex mu_;  // guards the node state below, up to monitor_
  CondVar cv_{&mu_};
  // The control protocol: node table, membership, barriers, deaths and
  // their verdicts (node_protocol.h).
  NodeProtocol protocol_ GUARDED_BY(mu_);
  // Its membership, for what the membership's own lock allows without mu_:
  // Subscribe, Publish (under no lock) and the metrics' queries.
  Membership& membership_;
  // Written under mu_, read by anyone (Send stamps my_id_ without a lock).
  std::atomic<int> my_id_{0};
  std::atomic<int> my_rank_{-1};
  // Members, once ready: the node table for the receive path (published
  // under mu_ by PublishRoutesLocked).
  Snapshot<Routes> routes_;
  bool acked_ GUARDED_BY(mu_) = false;
  // Member: why the scheduler refused it. Scheduler: why the rendezvous
  // failed (every later registration is refused with it).
  Status start_error_ GUARDED_BY(mu_);
  // Scheduler: how many nodes were told that the rendezvous failed.
  int told_failure_ GUARDED_BY(mu_) = 0;
  // Scheduler: the registrations (rendezvous_coordinator.h).
  RendezvousCoordinator rendezvous_ GUARDED_BY(mu_);
  // Peers of our domain yet to send SHM_READY.
  std::set<int> shm_pending_ GUARDED_BY(mu_);
  std::function<void(int, const Status&)> peer_failure_handler_ GUARDED_BY(mu_);
  bool stop_monitor_ GUARDED_BY(mu_) = false;
  std::thread monitor_;
  // The adaptive resend timer (null: fixed or none, Config::resend_adaptive);
  // its thread runs from Start to Stop.
  std::unique_ptr<Resender> resender_;

  std::atomic<uint64_t> num_duplicates_{0};
  std::atomic<uint64_t> num_resent_{0};
  std::atomic<uint64_t> num_test_drops_{0};
  std::atomic<uint64_t> num_fenced_{0};
  std::atomic<uint64_t> num_sent_{0};
  std::atomic<uint64_t> num_received_{0};
  uint64_t drop_state_ = 0;  // receive thread only: PS_DROP_MSG's generator

  std::vector<Message> early_;  // receive thread only: data before ready
  uint64_t early_bytes_ = 0;    // receive thread only: their data bytes

  // Orders registry changes with the holding of early requests; the
  // registry itself is a snapshot read with LoadCustomers() (changed under
  // customers_mu_).
  Mutex customers_mu_;
  Snapshot<CustomerMap> customers_;
  struct HeldRequest {
    Message msg;
    Clock::time_point since;
  };
  std::map<CustomerKey, std::vector<HeldRequest>> held_
      GUARDED_BY(customers_mu_);  // no customer yet
  // Members connected to for SimpleApp messages: id -> address.
  std::map<int, std::string> simple_app_peers_ GUARDED_BY(mu_);
  std::atomic<size_t> held_count_{0};  // changed under customers_mu_
  uint64_t held_bytes_ GUARDED_BY(customers_mu_) = 0;  // their data bytes
};

}  // namespace core
using core::Postoffice;

}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_POSTOFFICE_H_
