// Postoffice: start, the receive thread's first steps (who sent it, control
// messages), connection watch callbacks and shutdown. Data dispatch to the
// customers is in dispatch.cc, barriers and the monitor thread in
// barrier_monitor.cc, failures and the membership's subscribers in
// peer_events.cc, rendezvous in rendezvous.cc, restarts in rejoin.cc.
#include "postoffice/postoffice.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>

#include "postoffice/logging.h"

namespace ps {

namespace {
// How long a lost connection may take to come back before its node is
// declared dead (Van::WatchConnections): ZeroMQ retries every 100 ms.
constexpr int kLostConnectionGraceMs = 250;
constexpr int kLingerMs = 1000;

VanOptions VanOptionsOf(const Config& c, Metrics* metrics) {
  VanOptions o;
  o.metrics = metrics;
  o.secret_key = c.secret_key;
  o.scheduler = c.role == Role::kScheduler;
  o.max_message_bytes = c.max_message_bytes;
  o.water_mark = c.water_mark;
  o.handshake_timeout_ms = c.handshake_timeout_ms;
  o.max_idle_connections_per_source = c.max_idle_connections_per_source;
  o.max_idle_connections = c.max_idle_connections;
  o.heartbeat_interval_ms = c.heartbeat_interval_ms;
  o.heartbeat_timeout_ms = c.heartbeat_timeout_ms;
  return o;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Postoffice::Postoffice(const Config& config)
    : config_(config),
      metrics_(MakeMetrics(config.role)),
      van_(VanOptionsOf(config, metrics_.get())),
      protocol_(config),
      membership_(protocol_.membership()),
      rendezvous_(config.num_servers, config.num_workers) {
  // In this order: the protocols' messages go out before the KV layer and
  // the user (whose handler may end the process) are told.
  membership_.Subscribe([this](const PeerEvent& e) { OnPeerEventForLog(e); });
  membership_.Subscribe(
      [this](const PeerEvent& e) { OnPeerEventForCustomers(e); });
  membership_.Subscribe([this](const PeerEvent& e) { OnPeerEventForUser(e); });
  if (config_.resend_timeout_ms > 0 && config_.resend_adaptive &&
      !IsScheduler()) {
    // Resends skip Send: they are kept already.
    resender_ = std::make_unique<Resender>(
        config_.resend_timeout_ms, [this](Message* msg) {
          // Owed acknowledgements are made there; resends were sent before.
          if (msg->meta.ack()) {
            msg->meta.set_sender(my_id_.load());
          } else {
            CountResent();
            if (config_.verbose >= 1)
              LOG(INFO) << "resending " << DebugString(*msg);
          }
          Status st = van_.Send(msg);
          if (st.ok()) CountSent(*msg);
          return st;
        });
  }
}

Postoffice::~Postoffice() { Stop(); }

Status Postoffice::Bind() {
  if (bound_) return Status::OK();
  PS_RETURN_IF_ERROR(van_.Bind(config_.node_host, config_.port,
                               config_.port_range_lo, config_.port_range_hi));
  van_.set_identity(config_.node_host + ":" + std::to_string(van_.port()));
  if (config_.metrics_port >= 0) {
    // The node's own host unless told otherwise: never every interface
    // by default (docs/security.md).
    const std::string& host =
        config_.metrics_host.empty() ? config_.node_host : config_.metrics_host;
    PS_RETURN_IF_ERROR(
        metrics_->Serve(host, config_.metrics_port, config_.metrics_token));
    metrics_->SetCollectHook([this] { CollectPeerMetrics(); });
    // For the launcher (tracker/launch.py --metrics writes its targets).
    PrintEvent("{\"event\":\"metrics\",\"role\":" +
               JsonString(RoleName(config_.role)) +
               ",\"host\":" + JsonString(metrics_->address()) +
               ",\"port\":" + std::to_string(metrics_->port()) + "}");
  }
  bound_ = true;
  return Status::OK();
}

Status Postoffice::Start() {
  CHECK(!started_) << "Start() twice";
  PS_RETURN_IF_ERROR(Bind());
  started_ = true;
  if (IsScheduler()) {
    MutexLock lock(&mu_);
    my_id_ = kSchedulerId;
    my_rank_ = 0;
    metrics_->set_rank(0);
    NodeInfo me;
    me.role = Role::kScheduler;
    me.id = kSchedulerId;
    me.rank = 0;
    me.host = config_.node_host;
    me.port = port();
    me.wire_key = van_.wire_key();
    protocol_.RegisterSelf(me, Clock::now());
  }
  if (IsScheduler()) {
    PrintEvent("{\"event\":\"job\",\"servers\":" +
               std::to_string(config_.num_servers) +
               ",\"workers\":" + std::to_string(config_.num_workers) +
               ",\"replicas\":" + std::to_string(config_.replicas) +
               ",\"heartbeat_timeout_ms\":" +
               std::to_string(config_.heartbeat_timeout_ms) + "}");
  }
  // A node whose process dies closes its port: its connection drops and
  // every reconnect is refused. Wait briefly for one that merely dropped
  // (it comes back), then declare it dead, long before its heartbeats
  // would be missed. The scheduler watches every member; a member, the
  // scheduler only (the scheduler tells it of the others).
  int grace = std::min(kLostConnectionGraceMs, config_.heartbeat_timeout_ms);
  van_.WatchConnections(
      grace,
      [this](int id, const std::string& why) { OnConnectionLost(id, why); },
      IsScheduler() ? -1 : kSchedulerId,
      [this](int id) { OnConnectionRegained(id); });
  van_.Start([this](Message&& msg) { OnMessage(std::move(msg)); });
  if (resender_) resender_->Start();
  // The scheduler ticks from the start, as in the protocol's simulator: a
  // restarted one takes a running job over without a member that died
  // while no scheduler was up (NodeProtocol::TakeoverTick) before it is
  // ready. A member ticks once it has its id.
  const auto start_monitor = [this] {
    monitor_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "ps-monitor");
      MonitorLoop();
    });
  };
  if (IsScheduler()) start_monitor();
  Status st = IsScheduler() ? StartScheduler() : StartMember();
  if (!st.ok()) return st;
  if (!IsScheduler()) start_monitor();
  if (config_.verbose >= 1) {
    LOG(INFO) << DescribeNode(id()) << " is ready";
  }
  return Status::OK();
}

int Postoffice::id() const { return my_id_.load(); }

int Postoffice::rank() const { return my_rank_.load(); }

std::vector<int> Postoffice::GetNodeIds(int group) const {
  MutexLock lock(&mu_);
  return protocol_.table().Ids(group);
}

std::string Postoffice::DescribeNode(int id) const {
  MutexLock lock(&mu_);
  return protocol_.table().Describe(id);
}

bool Postoffice::rejoined() const {
  MutexLock lock(&mu_);
  return protocol_.rejoined();
}

Status Postoffice::peer_failure() const {
  MutexLock lock(&mu_);
  return protocol_.peer_failure();
}

void Postoffice::SetPeerFailureHandler(
    std::function<void(int id, const Status& why)> handler) {
  MutexLock lock(&mu_);
  peer_failure_handler_ = std::move(handler);
}

bool Postoffice::FindShared(const void* p, size_t bytes,
                            pb::SharedRef* ref) const {
  return van_.FindShared(p, bytes, ref);
}

StatusOr<SArray<char>> Postoffice::ResolveShared(const pb::SharedRef& ref,
                                                 size_t bytes) const {
  return van_.ResolveShared(ref, bytes);
}

Status Postoffice::Send(Message* msg) {
  msg->meta.set_sender(my_id_.load());
  if (config_.verbose >= 2) LOG(INFO) << "send " << DebugString(*msg);
  if (msg->meta.simple_app()) {
    Status st = ConnectForSimpleApp(msg->meta.recver());
    if (!st.ok()) return st;
  }
  // Kept before the send: its acknowledgement may come first.
  const bool kept = resender_ && Resender::Wants(msg->meta, config_.role);
  if (kept) resender_->Keep(msg, Clock::now());
  Status st = van_.Send(msg);
  if (!st.ok() && kept) resender_->Forget(msg->meta);
  if (st.ok()) CountSent(*msg);
  return st;
}

Status Postoffice::ConnectForSimpleApp(int id) {
  MutexLock lock(&mu_);
  if (id == kSchedulerId && !IsScheduler()) return Status::OK();
  if (!protocol_.ready()) {
    return Status::Unavailable(
        "this node has no node table yet (its "
        "rendezvous is not done): no SimpleApp "
        "message to node id " +
        std::to_string(id));
  }
  const NodeInfo* n = protocol_.table().Find(id);
  if (n == nullptr) {
    return Status::NotFound("node id " + std::to_string(id) +
                            " is not a member of the job");
  }
  if (protocol_.membership().IsDown(id)) {
    return Status::Unavailable(protocol_.table().Describe(id) + " is " +
                               PeerStateName(protocol_.membership().state(id)));
  }
  // Connected at rendezvous, or here to the address it has now (a restarted
  // worker comes back at another).
  auto it = simple_app_peers_.find(id);
  if (van_.IsConnected(id) &&
      (it == simple_app_peers_.end() || it->second == n->Address())) {
    return Status::OK();
  }
  simple_app_peers_[id] = n->Address();
  // Unwatched: a peer that leaves after its last answer is no failure.
  return van_.Connect(id, n->host, n->port, n->wire_key, /*watch=*/false);
}

void Postoffice::SendAll(std::vector<Message>* outbox) {
  for (Message& msg : *outbox) {
    Status st = Send(&msg);
    if (!st.ok()) LOG(WARNING) << "sending " << DebugString(msg) << ": " << st;
  }
  outbox->clear();
}

void Postoffice::CountDropped(int sender, const std::string& why) {
  van_.CountDropped(DescribeNode(sender), why);
}

// ---- Receive thread --------------------------------------------------------

void Postoffice::OnMessage(Message&& msg) {
  if (config_.verbose >= 2) LOG(INFO) << "recv " << DebugString(msg);
  // By the sender the header claims (ids past PrometheusMetrics::kMaxPeerIds
  // share one series); one that is not proven is also counted refused below.
  num_received_.fetch_add(1, std::memory_order_relaxed);
  metrics_->Received(msg.meta.sender(), WireBytes(msg));
  if (FastDispatch(&msg)) return;
  int sender = msg.meta.sender();
  pb::Command cmd = msg.meta.control().cmd();
  NodeProtocol::Output out;
  bool fenced = false;
  {
    MutexLock lock(&mu_);
    // A registering node has no id yet: SchedulerOnAddNode checks that it
    // registers the address its connection is named after.
    bool scheduler_add = IsScheduler() && cmd == pb::ADD_NODE;
    if (!scheduler_add && !SenderIsProvenLocked(msg)) {
      // A peer may learn the node table (and send) before we do. Held
      // up to a count and, in all, PS_MAX_MESSAGE_BYTES.
      if (MayHoldEarly(msg)) {
        early_bytes_ += MessageBytes(msg);
        early_.push_back(std::move(msg));
      }
      return;
    }
    // The protocol hears from its watched peers, answers a heartbeat of a
    // node declared dead with its death, and fences that node's data. (A
    // registration's sender is not proven: SchedulerOnAddNode checks it.)
    if (!scheduler_add) {
      fenced = protocol_.OnProven(sender, cmd, Clock::now(), &out);
      AfterStepLocked(&out);
    }
  }
  if (fenced) {
    num_fenced_.fetch_add(1);
    CountDropped(sender, "a data message of a node declared dead (fenced): " +
                             DebugString(msg));
    return;
  }
  if (!out.messages.empty()) {
    Flush(&out);
    return;
  }
  if (DropForTest(msg)) return;
  if (cmd == pb::EMPTY) {
    DispatchData(std::move(msg));
  } else {
    OnControl(std::move(msg));
  }
}

bool Postoffice::TakeAck(const Message& msg) {
  const pb::Meta& m = msg.meta;
  if (m.acks_size() > Resender::kMaxAcks ||
      (m.ack() &&
       (!msg.data.empty() || (m.attempt() <= 0 && m.acks_size() == 0)))) {
    CountDropped(m.sender(),
                 "a malformed acknowledgement: " + DebugString(msg));
    return true;
  }
  const Clock::time_point now = Clock::now();
  if (m.attempt() > 0 && !m.ack()) {
    if (resender_) {
      resender_->Owe(m.sender(), m, now);
    } else {
      Message ack = Resender::AckOf(m);
      Status st = Send(&ack);
      if (!st.ok() && config_.verbose >= 1) {
        LOG(INFO) << "acknowledging " << DebugString(msg) << ": " << st;
      }
    }
  }
  if (!resender_) return m.ack();
  if (m.ack() || m.acks_size() > 0) resender_->OnAck(m.sender(), m, now);
  if (config_.role == Role::kWorker && !m.request() && !m.ack() &&
      !m.simple_app()) {
    resender_->OnAnswer(m.sender(), m);
  }
  return m.ack();
}

bool Postoffice::DropForTest(const Message& msg) {
  if (config_.drop_percent == 0 || msg.meta.control().cmd() != pb::EMPTY ||
      msg.meta.simple_app()) {
    return false;
  }
  if (drop_state_ == 0) drop_state_ = std::random_device()() | 1;
  // xorshift64: cheap, and any sequence will do.
  drop_state_ ^= drop_state_ << 13;
  drop_state_ ^= drop_state_ >> 7;
  drop_state_ ^= drop_state_ << 17;
  if (static_cast<int>(drop_state_ % 100) >= config_.drop_percent) return false;
  num_test_drops_.fetch_add(1);
  if (config_.verbose >= 1) LOG(INFO) << "PS_DROP_MSG: " << DebugString(msg);
  return true;
}

void Postoffice::PublishRoutesLocked() {
  Routes next;
  next.table = protocol_.table();
  next.my_id = my_id_.load();
  next.ready = true;
  next.down = protocol_.membership().Down();
  routes_.Update([&](Routes& routes) { routes = std::move(next); });
}

bool Postoffice::SenderIsProvenLocked(const Message& msg) {
  int sender = msg.meta.sender();
  const NodeInfo* claimed =
      sender == my_id_ ? nullptr : protocol_.table().Find(sender);
  if (claimed != nullptr) {
    if (claimed->HasIdentity(msg.from)) return true;
    van_.CountDropped(
        Van::DescribeConnection(msg.from, msg.peer_address),
        "it claims to be " + claimed->Describe() + " in " + DebugString(msg));
    return false;
  }
  if (!IsScheduler() && !protocol_.ready() && sender == kSchedulerId) {
    // Before the node table we know the scheduler by its port only.
    if (EndsWith(msg.from, ":" + std::to_string(config_.root_port))) {
      return true;
    }
    van_.CountDropped(Van::DescribeConnection(msg.from, msg.peer_address),
                      "it claims to be the scheduler at " +
                          config_.SchedulerAddress() + " in " +
                          DebugString(msg));
    return false;
  }
  if (!MayHoldEarly(msg)) {
    van_.CountDropped(Van::DescribeConnection(msg.from, msg.peer_address),
                      "unknown sender of " + DebugString(msg));
  }
  return false;
}

bool Postoffice::MayHoldEarly(const Message& msg) const {
  pb::Command cmd = msg.meta.control().cmd();
  return !protocol_.ready() && (cmd == pb::EMPTY || cmd == pb::SHM_READY) &&
         protocol_.table().Find(msg.meta.sender()) == nullptr &&
         early_.size() < kMaxEarlyMessages &&
         early_bytes_ + MessageBytes(msg) <=
             static_cast<uint64_t>(config_.max_message_bytes);
}

void Postoffice::OnControl(Message&& msg) {
  const pb::Control& ctrl = msg.meta.control();
  if (NodeProtocol::Takes(ctrl.cmd())) {
    NodeProtocol::Output out;
    {
      MutexLock lock(&mu_);
      protocol_.OnControl(msg.meta, Clock::now(), &out);
      AfterStepLocked(&out);
    }
    Flush(&out);
    return;
  }
  switch (ctrl.cmd()) {
    case pb::ADD_NODE:
      if (IsScheduler() && msg.meta.request()) {
        SchedulerOnAddNode(msg);
      } else if (!IsScheduler() && !msg.meta.request()) {
        MemberOnNodeTable(msg);
      } else {
        CountDropped(msg.meta.sender(), "unexpected " + DebugString(msg));
      }
      return;
    case pb::ACK: {
      MutexLock lock(&mu_);
      acked_ = true;
      cv_.SignalAll();
      return;
    }
    case pb::SHM_READY: {
      // The sender tried to map our probe; no error: it can read our
      // shared memory.
      bool expected;
      {
        MutexLock lock(&mu_);
        expected = shm_pending_.erase(msg.meta.sender()) > 0;
        if (expected && ctrl.error().empty()) {
          van_.SendReferencesTo(msg.meta.sender());
        }
        cv_.SignalAll();
      }
      if (!expected) {
        CountDropped(msg.meta.sender(), "unexpected " + DebugString(msg));
      }
      return;
    }
    default:
      CountDropped(msg.meta.sender(), "unexpected " + DebugString(msg));
  }
}

void Postoffice::OnConnectionLost(int id, const std::string& why) {
  NodeProtocol::Output out;
  {
    MutexLock lock(&mu_);
    protocol_.OnConnectionLost(id, why, Clock::now(), &out);
    AfterStepLocked(&out);
  }
  Flush(&out);
}

void Postoffice::OnConnectionRegained(int id) {
  Message report;
  {
    MutexLock lock(&mu_);
    // The scheduler's address answers again: maybe a restarted scheduler
    // (PS_MAX_RESTARTS), which learns the job from the members' reports.
    // An old one that only lost the connection answers the report too.
    if (IsScheduler() || id != kSchedulerId || !protocol_.ready() ||
        protocol_.finalized() || config_.max_restarts == 0) {
      return;
    }
    report = protocol_.ReportToScheduler();
  }
  Send(&report).IgnoreError();  // heartbeats find a scheduler that is gone
}

void Postoffice::ReportResends() const {
  uint64_t resent = num_resent(), dups = num_duplicates();
  uint64_t drops = num_test_drops();
  if (resent == 0 && dups == 0 && drops == 0) return;
  std::string who;
  {
    MutexLock lock(&mu_);
    who = my_id_ == 0 ? RoleName(config_.role)
                      : protocol_.table().Describe(my_id_);
  }
  std::string line = who + ": " + std::to_string(resent) +
                     " requests resent, " + std::to_string(dups) +
                     " duplicates let go, " + std::to_string(drops) +
                     " messages dropped by PS_DROP_MSG";
  Tell(google::GLOG_INFO, line);
}

// ---- Shutdown --------------------------------------------------------------

Status Postoffice::Finalize(bool do_barrier) {
  Status st;
  bool ready;
  {
    MutexLock lock(&mu_);
    ready = protocol_.ready();
  }
  if (do_barrier && started_ && ready) st = Barrier(kAllGroups);
  {
    MutexLock lock(&mu_);
    protocol_.set_finalized();
  }
  // Stay until every member said it leaves, so none sends into the void.
  if (IsScheduler() && st.ok()) AwaitGoodbyes();
  Stop();
  return st;
}

void Postoffice::Abandon() {
  {
    MutexLock lock(&mu_);
    abandoned_ = true;
  }
  Stop();
}

void Postoffice::Stop() {
  if (stopped_) return;
  stopped_ = true;
  bool say_goodbye = false;
  bool clean = false;
  bool told_failure = false;
  {
    MutexLock lock(&mu_);
    told_failure = told_failure_ > 0;
    stop_monitor_ = true;
    say_goodbye = !IsScheduler() && protocol_.ready() && !abandoned_ &&
                  !protocol_.membership().IsDown(kSchedulerId);
    // A node that stops because a peer failed is not a second failure:
    // blame stays with the peer.
    clean = protocol_.finalized() || !protocol_.peer_failure().ok();
    cv_.SignalAll();
  }
  if (monitor_.joinable()) {
    // A failure handler on the monitor thread may end the process (exit()
    // runs this from there): it cannot join itself.
    if (monitor_.get_id() == std::this_thread::get_id()) {
      monitor_.detach();
    } else {
      monitor_.join();
    }
  }
  if (resender_) resender_->Stop();
  ReportResends();
  if (say_goodbye) {
    // Only Finalize is a clean departure: a node stopped without it (its
    // process exited early, e.g. after an error) is a failure, reported at
    // once rather than after the heartbeat timeout.
    Message bye = ControlMessage(pb::TERMINATE, kSchedulerId, true);
    if (!clean) {
      bye.meta.mutable_control()->set_error(
          "it stopped without Finalize (its process exited or failed)");
    }
    Status st = Send(&bye);
    if (!st.ok()) {
      LOG(WARNING) << "could not tell the scheduler: " << st;
    } else if (!van_.Flush(kSchedulerId, kLingerMs)) {
      // A sealed stream that the scheduler asks to start again (a gap
      // after a freeze) sends the goodbye again only while this runs.
      LOG(WARNING) << "the scheduler did not confirm this node's goodbye "
                      "within "
                   << kLingerMs << " ms";
    }
  }
  // What it said last (goodbye, or why the job cannot start) still goes.
  van_.Stop(say_goodbye || told_failure ? kLingerMs : 0);
  metrics_->StopServing();
  const std::vector<std::shared_ptr<Customer>> customers = Customers();
  PeerEvent stopped;
  stopped.kind = PeerEvent::kStopped;
  stopped.id = -1;
  stopped.from = stopped.to = PeerState::kAbsent;
  stopped.why = "node stopped";
  stopped.status = Status::Aborted(stopped.why);
  for (auto& c : customers) {
    if (c->on_event) c->on_event(stopped);
  }
}

}  // namespace ps
