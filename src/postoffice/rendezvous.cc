// Rendezvous: members register with the scheduler (ADD_NODE), the scheduler
// assigns ranks once all arrived and sends everyone the node table.
//
//   member                          scheduler
//   ADD_NODE request (my address) ->  connect back, ACK, CheckRequestedRank
//   <- ACK                            (all arrived) AssignRanks
//   <- ADD_NODE response (table)      ... to every member
//   connect to the peers it talks to
//   map the shm_probe of each peer of its domain, SHM_READY to it (with
//   the reason if that failed); Start returns when all such peers answered
//
// Restarts (PS_MAX_RESTARTS) are in rejoin.cc.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "postoffice/logging.h"
#include "postoffice/postoffice.h"
#include "van/shm.h"

namespace ps {

namespace {
// Whether a registration's token is the job's: any when the job has none;
// compared in constant time (no timing tells a stranger how much matched).
bool SameToken(const std::string& given, const std::string& job) {
  if (job.empty()) return true;
  if (given.size() != job.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < job.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i] ^ job[i]);
  }
  return diff == 0;
}
}  // namespace

Status Postoffice::StartScheduler() {
  MutexLock lock(&mu_);
  auto deadline =
      Clock::now() + std::chrono::milliseconds(config_.rendezvous_timeout_ms);
  WaitReportingLocked(
      deadline,
      [&] {
        mu_.AssertHeld();  // called by WaitReportingLocked, under mu_
        return protocol_.ready() || told_failure_ > 0;
      },
      [&](int64_t waited) {
        mu_.AssertHeld();
        return RendezvousWaitLineLocked(waited);
      });
  if (protocol_.ready()) return Status::OK();
  if (told_failure_ > 0) {
    // Nodes launched with this one are still arriving: each is told why
    // (SchedulerOnAddNode refuses it with start_error_) before this node
    // stops, within the connect timeout.
    const auto grace =
        Clock::now() + std::chrono::milliseconds(config_.connect_timeout_ms);
    while (told_failure_ < config_.num_servers + config_.num_workers &&
           cv_.WaitUntil(grace)) {
    }
    PrintEvent("{\"event\":\"start_failed\",\"reason\":" +
               JsonString(start_error_.message()) + "}");
    return start_error_;
  }
  if (protocol_.takeover().reported() > 0) {
    // A restarted scheduler that heard from some members of a running job.
    return Status::Timeout(
        "the restarted scheduler at " + config_.SchedulerAddress() +
        " heard from " + std::to_string(protocol_.takeover().reported()) +
        " of " + std::to_string(config_.num_servers + config_.num_workers) +
        " members of the running job within " +
        std::to_string(config_.rendezvous_timeout_ms) +
        " ms (PS_RENDEZVOUS_TIMEOUT_MS); missing: " +
        protocol_.takeover().Missing());
  }
  Status st = Status::Timeout(
      "rendezvous at the scheduler " + config_.SchedulerAddress() +
      " timed out after " + std::to_string(config_.rendezvous_timeout_ms) +
      " ms (PS_RENDEZVOUS_TIMEOUT_MS): " + rendezvous_.Shortfall());
  std::vector<Message> outbox;
  for (const NodeInfo& n : rendezvous_.arrivals()) {
    Message msg = ControlMessage(pb::ADD_NODE, n.id, false);
    msg.meta.mutable_control()->set_error(st.message());
    msg.meta.mutable_control()->set_error_code(st.code());
    outbox.push_back(std::move(msg));
  }
  told_failure_ = static_cast<int>(outbox.size());
  lock.Unlock();
  SendAll(&outbox);
  PrintEvent("{\"event\":\"start_failed\",\"reason\":" +
             JsonString(st.message()) + "}");
  return st;
}

std::string Postoffice::RendezvousWaitLineLocked(int64_t waited) const {
  const std::string line = "the scheduler at " + config_.SchedulerAddress() +
                           " has waited " + Seconds(waited);
  if (protocol_.takeover().reported() > 0) {
    return line + " for the running job's members to report (restarted; " +
           std::to_string(protocol_.takeover().reported()) + " of " +
           std::to_string(config_.num_servers + config_.num_workers) +
           " did); missing: " + protocol_.takeover().Missing();
  }
  return line + " for the rendezvous (PS_RENDEZVOUS_TIMEOUT_MS=" +
         std::to_string(config_.rendezvous_timeout_ms) +
         "): " + rendezvous_.Shortfall();
}

std::string Postoffice::MyShmDomain() const {
  return config_.shm ? SharedMemory::Domain() : std::string();
}

NodeInfo Postoffice::MyRegistration() {
  NodeInfo me;
  me.role = config_.role;
  me.host = config_.node_host;
  me.port = port();
  me.requested_rank = config_.rank;
  me.wire_key = van_.wire_key();
  me.shm_domain = MyShmDomain();
  if (!me.shm_domain.empty()) {
    StatusOr<SArray<char>> probe = SharedMemory::Get().Allocate(1);
    if (probe.ok()) {
      shm_probe_ = std::move(probe).value();
      SharedMemory::Get().Find(shm_probe_.data(), 1, &me.shm_probe);
    } else {
      LOG(WARNING) << "no shared memory (" << probe.status().message()
                   << "): everything goes through the socket";
      me.shm_domain.clear();
    }
  }
  return me;
}

Status Postoffice::StartMember() {
  PS_RETURN_IF_ERROR(van_.Connect(kSchedulerId, config_.root_uri,
                                  config_.root_port,
                                  van_.scheduler_wire_key()));
  Message hello = ControlMessage(pb::ADD_NODE, kSchedulerId, true);
  const NodeInfo me = MyRegistration();
  ToProto(me, hello.meta.mutable_control()->add_node());
  hello.meta.mutable_control()->set_num_servers(config_.num_servers);
  hello.meta.mutable_control()->set_num_workers(config_.num_workers);
  hello.meta.mutable_control()->set_job_token(config_.job_token);
  // A scheduler that refused the handshake (another key, or none) may have
  // done so before the send: then the send fails at once.
  const Status sent = Send(&hello);
  MutexLock lock(&mu_);
  const std::string me_line = RoleName(config_.role) + std::string(" at ") +
                              me.Address() + " has waited ";
  PS_RETURN_IF_ERROR(AwaitAckLocked(sent, me_line));
  auto deadline = Clock::now() + std::chrono::milliseconds(
                                     int64_t{config_.rendezvous_timeout_ms} +
                                     config_.connect_timeout_ms);
  WaitReportingLocked(
      deadline,
      [&] {
        mu_.AssertHeld();
        return protocol_.ready() || !start_error_.ok();
      },
      [&](int64_t waited) {
        return me_line + Seconds(waited) + " for the node table from the " +
               "scheduler at " + config_.SchedulerAddress() +
               " (the scheduler's log names who has not registered; "
               "PS_RENDEZVOUS_TIMEOUT_MS=" +
               std::to_string(config_.rendezvous_timeout_ms) + ")";
      });
  if (!protocol_.ready() && start_error_.ok()) {
    return Status::Timeout("no node table from the scheduler at " +
                           config_.SchedulerAddress() + " within " +
                           std::to_string(config_.rendezvous_timeout_ms) +
                           " ms (PS_RENDEZVOUS_TIMEOUT_MS)");
  }
  if (!start_error_.ok()) return start_error_;
  AwaitShmAnswersLocked();
  return Status::OK();
}

Status Postoffice::AwaitAckLocked(const Status& sent,
                                  const std::string& me_line) {
  auto deadline =
      Clock::now() + std::chrono::milliseconds(config_.connect_timeout_ms);
  WaitReportingLocked(
      deadline,
      [&] {
        mu_.AssertHeld();  // called by WaitReportingLocked, under mu_
        return !sent.ok() || acked_;
      },
      [&](int64_t waited) {
        return me_line + Seconds(waited) + " for the scheduler at " +
               config_.SchedulerAddress() +
               " to take its registration (PS_CONNECT_TIMEOUT_MS=" +
               std::to_string(config_.connect_timeout_ms) + ")";
      });
  if (acked_) return Status::OK();
  return Status::Unavailable(
      "scheduler at " + config_.SchedulerAddress() +
      (sent.ok() ? " did not answer within " +
                       std::to_string(config_.connect_timeout_ms) +
                       " ms (PS_CONNECT_TIMEOUT_MS)"
                 : " took no registration (" + sent.message() + ")") +
      ": is it running there" +
      (config_.secret_key.empty() ? ", and does it run without PS_KEY_FILE too?"
                                  : ", and does it use the same PS_KEY_FILE?"));
}

void Postoffice::AwaitShmAnswersLocked() {
  // Peers of our domain say whether they mapped our probe (SHM_READY), so
  // that from the first request on we know where references may go. Without
  // an answer we only lose the shortcut: everything still goes by socket.
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(config_.rendezvous_timeout_ms);
  const auto pending = [&] {
    mu_.AssertHeld();
    std::string missing;
    for (int id : shm_pending_) {
      missing += " " + protocol_.table().Describe(id);
    }
    return missing;
  };
  WaitReportingLocked(
      deadline,
      [&] {
        mu_.AssertHeld();
        return shm_pending_.empty();
      },
      [&](int64_t waited) {
        mu_.AssertHeld();
        return protocol_.table().Describe(my_id_) + " has waited " +
               Seconds(waited) + " for the shared-memory answer of" + pending();
      });
  if (!shm_pending_.empty()) {
    const std::string missing = pending();
    LOG(WARNING) << "no shared-memory answer from" << missing
                 << "; sending to them through the socket";
    shm_pending_.clear();
  }
}

bool Postoffice::ReadRegistration(const Message& msg, NodeInfo* node) {
  const pb::Control& ctrl = msg.meta.control();
  if (ctrl.node_size() != 1 || ctrl.node(0).role() == pb::SCHEDULER ||
      !pb::NodeRole_IsValid(ctrl.node(0).role())) {
    CountDropped(msg.meta.sender(), "malformed ADD_NODE");
    return false;
  }
  *node = FromProto(ctrl.node(0));
  if (msg.from != node->Identity()) {
    // Its connection would not be the one we answer and later hear it on.
    van_.CountDropped(Van::DescribeConnection(msg.from, msg.peer_address),
                      "it registers as " + node->Address() +
                          ", not the address its connection is named after");
    return false;
  }
  return true;
}

void Postoffice::SchedulerOnAddNode(const Message& msg) {
  const pb::Control& ctrl = msg.meta.control();
  NodeInfo node;
  if (!ReadRegistration(msg, &node)) return;
  const bool token_ok = SameToken(ctrl.job_token(), config_.job_token);
  if (ctrl.rejoin()) {
    if (!token_ok) {
      van_.CountDropped(Van::DescribeConnection(msg.from, msg.peer_address),
                        "a member's report without this job's token "
                        "(PS_JOB_TOKEN)");
      return;
    }
    return SchedulerOnMemberReport(msg, node);
  }
  NodeProtocol::Output out;
  int told_now = 0;  // nodes this registration tells the start failed
  {
    MutexLock lock(&mu_);
    Status shape;
    const Status st = RegistrationErrorLocked(node, ctrl, token_ok, &shape);
    const std::string connection =
        Van::DescribeConnection(msg.from, msg.peer_address);
    // A refusal is answered (so that a misconfigured node says why it
    // stops), but only so many times: each answer costs a connection.
    if (!st.ok() && !rendezvous_.AnswerRefusal()) {
      van_.CountDropped(connection, "registration refused: " + st.message());
      return;
    }
    node.id = rendezvous_.NextTempId();
    Status connected =
        van_.Connect(node.id, node.host, node.port, node.wire_key);
    if (!connected.ok()) {
      LOG(WARNING) << "cannot reach a registering " << RoleName(node.role)
                   << ": " << connected;
      return;
    }
    // The ACK answers this node, and goes first: a member waits for it
    // before it accepts a node table.
    out.messages.push_back(ControlMessage(pb::ACK, node.id, false));
    if (!st.ok()) {
      van_.CountDropped(connection, "registration refused: " + st.message());
      told_now = RefuseLocked(node, st, shape, token_ok, &out.messages);
    } else {
      TakeRegistrationLocked(node, &out);
    }
    AfterStepLocked(&out);
  }
  Flush(&out);
  if (told_now > 0) {
    // StartScheduler returns (and the node stops) once the failure is on
    // its way to every node.
    MutexLock lock(&mu_);
    told_failure_ += told_now;
    cv_.SignalAll();
  }
}

Status Postoffice::RegistrationErrorLocked(const NodeInfo& node,
                                           const pb::Control& ctrl,
                                           bool token_ok, Status* shape) {
  // A node of another job (no token, or another) is refused, and does not
  // fail this job's rendezvous; one of this job with another shape does.
  if (!token_ok) {
    return Status::InvalidArgument("the " + std::string(RoleName(node.role)) +
                                   " at " + node.Address() +
                                   " has not this job's token (PS_JOB_TOKEN): "
                                   "refused");
  }
  *shape = rendezvous_.CheckShape(node, ctrl.num_servers(), ctrl.num_workers());
  if (!shape->ok()) return *shape;
  if (!start_error_.ok()) return start_error_;
  if (!protocol_.ready()) return rendezvous_.CheckArrival(node);
  return protocol_.CheckRestart(node);
}

int Postoffice::RefuseLocked(const NodeInfo& node, const Status& st,
                             const Status& shape, bool token_ok,
                             std::vector<Message>* outbox) {
  int told = 0;
  Message reject = ControlMessage(pb::ADD_NODE, node.id, false);
  reject.meta.mutable_control()->set_error(st.message());
  reject.meta.mutable_control()->set_error_code(st.code());
  outbox->push_back(std::move(reject));
  if (!start_error_.ok() && token_ok) told = 1;  // after the failure
  if (!shape.ok() && !protocol_.ready() && start_error_.ok()) {
    // A job launched with two shapes cannot run: every node that arrived
    // learns why now, not at the rendezvous timeout, and so do later ones.
    start_error_ =
        Status::InvalidArgument("rendezvous failed: " + shape.message());
    LOG(ERROR) << start_error_;
    for (const NodeInfo& n : rendezvous_.arrivals()) {
      Message fail = ControlMessage(pb::ADD_NODE, n.id, false);
      fail.meta.mutable_control()->set_error(start_error_.message());
      fail.meta.mutable_control()->set_error_code(start_error_.code());
      outbox->push_back(std::move(fail));
    }
    told = 1 + static_cast<int>(rendezvous_.arrivals().size());
  }
  return told;
}

void Postoffice::TakeRegistrationLocked(const NodeInfo& node,
                                        NodeProtocol::Output* out) {
  // out->messages[0] is the ACK to node, addressed by its temporary id.
  if (protocol_.ready()) {
    bool started = false;
    const int id = protocol_.RegisterRestart(node, Clock::now(), &started, out);
    // Its connection is the worker's id's now.
    if (started) out->messages[0].meta.set_recver(id);
    return;
  }
  const bool complete = rendezvous_.Arrive(node);
  if (config_.verbose >= 1) {
    LOG(INFO) << RoleName(node.role) << " at " << node.Address()
              << " registered; " << rendezvous_.Shortfall();
  }
  if (!complete) return;
  // Ranks are assigned and connections rekeyed before the ACK leaves:
  // address it by the id this node was given.
  std::map<int, int> new_ids;
  CompleteRendezvousLocked(&new_ids, out);
  out->messages[0].meta.set_recver(new_ids.at(node.id));
}

void Postoffice::CompleteRendezvousLocked(std::map<int, int>* new_ids,
                                          NodeProtocol::Output* out) {
  const std::vector<NodeInfo>& arrivals = rendezvous_.arrivals();
  std::vector<NodeInfo> assigned = rendezvous_.Assign();
  CHECK_EQ(assigned.size(), arrivals.size());
  for (size_t i = 0; i < assigned.size(); ++i) {
    (*new_ids)[arrivals[i].id] = assigned[i].id;
    van_.Rekey(arrivals[i].id, assigned[i].id);
  }
  protocol_.AdmitAll(assigned, Clock::now(), out);
  if (config_.verbose >= 1) {
    for (const auto& [id, info] : protocol_.table().nodes()) {
      LOG(INFO) << "node table: id " << id << " = " << info.Describe();
    }
  }
}

void Postoffice::MemberOnNodeTable(const Message& msg) {
  const pb::Control& ctrl = msg.meta.control();
  std::vector<Message> early;
  // Peers of our domain, and why we cannot map their memory ("" if we can).
  std::vector<std::pair<int, std::string>> probed;
  {
    MutexLock lock(&mu_);
    // Once we run, a table marked rejoin is a scheduler's answer to our
    // report (a restarted one took the job over, or one that only lost
    // its connection to us for a moment).
    if (protocol_.ready() && ctrl.rejoin() && ctrl.error().empty()) {
      lock.Unlock();
      return MemberOnSchedulerBack();
    }
    if (protocol_.ready()) {
      van_.CountDropped("scheduler", "a second node table");
      return;
    }
    NodeTable table;
    for (const pb::NodeInfo& p : ctrl.node()) table.Add(FromProto(p));
    const NodeInfo* me = table.Find(msg.meta.recver());
    Status st;  // the scheduler's refusal, or why the table cannot be used
    if (!ctrl.error().empty()) {
      st = Status(static_cast<Status::Code>(ctrl.error_code()), ctrl.error());
      if (st.ok()) st = Status::Internal(ctrl.error());
    }
    if (st.ok() && (me == nullptr || me->role != config_.role)) {
      st = Status::Corruption("node table without this node");
    }
    if (st.ok()) {
      st = ConnectToPeersLocked(
          table, *me, {ctrl.dead().begin(), ctrl.dead().end()}, &probed);
    }
    if (!st.ok()) {
      start_error_ = st;
      cv_.SignalAll();
      return;
    }
    my_id_ = me->id;
    my_rank_ = me->rank;
    metrics_->set_rank(me->rank);
    if (ctrl.rejoin()) protocol_.set_rejoined();
    const int me_id = me->id;  // (me points into table)
    protocol_.Import(std::move(table), {ctrl.dead().begin(), ctrl.dead().end()},
                     me_id, Clock::now());
    PublishRoutesLocked();
    early.swap(early_);
    early_bytes_ = 0;
    cv_.SignalAll();
  }
  for (const auto& [id, why] : probed) {
    Message ready = ControlMessage(pb::SHM_READY, id, false);
    ready.meta.mutable_control()->set_error(why);
    Status st = Send(&ready);
    if (!st.ok()) {
      LOG(WARNING) << "SHM_READY to " << DescribeNode(id) << ": " << st;
    }
  }
  for (Message& m : early) OnMessage(std::move(m));
}

Status Postoffice::ConnectToPeersLocked(
    const NodeTable& table, const NodeInfo& me, const std::set<int>& dead,
    std::vector<std::pair<int, std::string>>* probed) {
  // Workers talk to servers, servers to workers; all to the scheduler.
  // With replicas, a server also talks to its replica and its primary (the
  // forwarded pushes and their answers, by socket).
  if (config_.role == Role::kServer && config_.replicas > 0) {
    const int n = config_.num_servers;
    const std::set<int> others = {ServerRankToId(ReplicaOf(me.rank, n)),
                                  ServerRankToId(PrimaryOf(me.rank, n))};
    for (int id : others) {
      const NodeInfo* other = table.Find(id);
      if (other == nullptr) continue;
      PS_RETURN_IF_ERROR(
          van_.Connect(id, other->host, other->port, other->wire_key));
    }
  }
  const int peers = config_.role == Role::kWorker ? kServerGroup : kWorkerGroup;
  for (int id : table.Ids(peers)) {
    if (dead.count(id) > 0) continue;  // a rejoin: it died meanwhile
    const NodeInfo* n = table.Find(id);
    PS_RETURN_IF_ERROR(van_.Connect(id, n->host, n->port, n->wire_key));
    if (!n->shm_domain.empty() && n->shm_domain == MyShmDomain()) {
      shm_pending_.insert(id);
      probed->emplace_back(id, ProbeSharedMemory(*n));
    }
  }
  return Status::OK();
}

std::string Postoffice::ProbeSharedMemory(const NodeInfo& peer) {
  StatusOr<SArray<char>> page = SharedMemory::Get().Resolve(peer.shm_probe, 1);
  if (!page.ok()) {
    LOG(WARNING) << "cannot map the shared memory of " << peer.Describe()
                 << " (" << page.status().message()
                 << "); it sends to this node through the socket";
    return page.status().message();
  }
  van_.AcceptReferencesFrom(peer.id, peer.Identity(), peer.shm_probe.pid());
  return "";
}

}  // namespace ps
