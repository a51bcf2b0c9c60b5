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
// Restarts (PS_MAX_RESTARTS): a worker registering while the job runs is a
// restart of a dead one, under its rank (PS_RANK). Its registration waits
// until the old process is declared dead, then:
//   successor                 scheduler                   members
//   ADD_NODE request ->       ACK, table takes the new address,
//                             NODE_JOINED request ->      reconnect, probe
//                                                         its shm, forget the
//                                                         old one's requests
//                             <- NODE_JOINED response     (SHM_READY to it)
//   <- ADD_NODE response (table, rejoin)
// so that no member hears the successor before it knows its address.
//
// A restarted scheduler (PS_MAX_RESTARTS) binds the old one's address. The
// members, which waited for it (the data path does not need it), report
// themselves every heartbeat interval (ADD_NODE with rejoin, their id and
// rank) until it answers; once every member reported, it holds the table
// again and answers each (ADD_NODE response with rejoin); they send it
// again the barriers they were waiting in.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "postoffice/postoffice.h"
#include "van/shm.h"

namespace ps {

namespace {
// Refused registrations answered beyond the job's size (each answer costs
// the scheduler a connection back); later ones are only counted.
constexpr int kMaxExtraRefusals = 16;
}  // namespace

Status Postoffice::StartScheduler() {
  MutexLock lock(&mu_);
  auto deadline =
      Clock::now() + std::chrono::milliseconds(config_.rendezvous_timeout_ms);
  while (!ready_ && cv_.WaitUntil(deadline)) {
  }
  if (ready_) return Status::OK();
  if (table_.nodes().size() > 1) {
    // A restarted scheduler that heard from some members of a running job.
    std::string missing;
    for (int group : {kServerGroup, kWorkerGroup}) {
      const int n =
          group == kServerGroup ? config_.num_servers : config_.num_workers;
      for (int r = 0; r < n; ++r) {
        const int id =
            group == kServerGroup ? ServerRankToId(r) : WorkerRankToId(r);
        if (table_.Find(id) == nullptr) {
          missing += (missing.empty() ? "" : ", ") + DescribeId(id);
        }
      }
    }
    return Status::Timeout(
        "the restarted scheduler at " + config_.SchedulerAddress() +
        " heard from " + std::to_string(table_.nodes().size() - 1) + " of " +
        std::to_string(config_.num_servers + config_.num_workers) +
        " members of the running job within " +
        std::to_string(config_.rendezvous_timeout_ms) +
        " ms (PS_RENDEZVOUS_TIMEOUT_MS); missing: " + missing);
  }
  Status st = Status::Timeout(
      "rendezvous at the scheduler " + config_.SchedulerAddress() +
      " timed out after " + std::to_string(config_.rendezvous_timeout_ms) +
      " ms (PS_RENDEZVOUS_TIMEOUT_MS): " + RendezvousShortfallLocked());
  std::vector<Message> outbox;
  for (const NodeInfo& n : arrivals_) {
    Message msg = ControlMessage(pb::ADD_NODE, n.id, false);
    msg.meta.mutable_control()->set_error(st.message());
    msg.meta.mutable_control()->set_error_code(st.code());
    outbox.push_back(std::move(msg));
  }
  lock.Unlock();
  SendAll(&outbox);
  return st;
}

std::string Postoffice::RendezvousShortfallLocked() const {
  int servers = 0, workers = 0;
  std::string addresses;
  for (const NodeInfo& n : arrivals_) {
    (n.role == Role::kServer ? servers : workers)++;
    addresses += std::string(addresses.empty() ? "" : ", ") + RoleName(n.role) +
                 " at " + n.Address();
  }
  // Who is missing: by rank where every arrival of the role asked for one
  // (the tracker sets PS_RANK), else by count.
  std::string missing;
  for (Role role : {Role::kServer, Role::kWorker}) {
    int want =
        role == Role::kServer ? config_.num_servers : config_.num_workers;
    std::set<int> ranks;
    int unranked = 0;
    for (const NodeInfo& n : arrivals_) {
      if (n.role != role) continue;
      if (n.requested_rank >= 0) {
        ranks.insert(n.requested_rank);
      } else {
        ++unranked;
      }
    }
    int absent = want - static_cast<int>(ranks.size()) - unranked;
    if (absent <= 0) continue;
    if (unranked == 0) {
      for (int r = 0; r < want; ++r) {
        if (ranks.count(r) > 0) continue;
        missing += (missing.empty() ? "" : ", ") + std::string(RoleName(role)) +
                   " " + std::to_string(r);
      }
    } else {
      missing += (missing.empty() ? "" : ", ") + std::to_string(absent) + " " +
                 RoleName(role) + (absent > 1 ? "s" : "");
    }
  }
  return std::to_string(servers) + " of " +
         std::to_string(config_.num_servers) + " servers and " +
         std::to_string(workers) + " of " +
         std::to_string(config_.num_workers) + " workers arrived" +
         (addresses.empty() ? "" : " (" + addresses + ")") +
         (missing.empty() ? "" : "; missing: " + missing);
}

std::string Postoffice::MyShmDomain() const {
  return config_.shm ? SharedMemory::Domain() : std::string();
}

Status Postoffice::StartMember() {
  PS_RETURN_IF_ERROR(
      van_.Connect(kSchedulerId, config_.root_uri, config_.root_port));
  Message hello = ControlMessage(pb::ADD_NODE, kSchedulerId, true);
  NodeInfo me;
  me.role = config_.role;
  me.host = config_.node_host;
  me.port = port();
  me.requested_rank = config_.rank;
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
  ToProto(me, hello.meta.mutable_control()->add_node());
  hello.meta.mutable_control()->set_num_servers(config_.num_servers);
  hello.meta.mutable_control()->set_num_workers(config_.num_workers);
  PS_RETURN_IF_ERROR(Send(&hello));
  MutexLock lock(&mu_);
  auto connect_deadline =
      Clock::now() + std::chrono::milliseconds(config_.connect_timeout_ms);
  while (!acked_ && cv_.WaitUntil(connect_deadline)) {
  }
  if (!acked_) {
    return Status::Unavailable(
        "scheduler at " + config_.SchedulerAddress() +
        " did not answer within " + std::to_string(config_.connect_timeout_ms) +
        " ms (PS_CONNECT_TIMEOUT_MS): is it running there" +
        (config_.secret_key.empty()
             ? ", and does it run without PS_KEY_FILE too?"
             : ", and does it use the same PS_KEY_FILE?"));
  }
  auto deadline = Clock::now() + std::chrono::milliseconds(
                                     int64_t{config_.rendezvous_timeout_ms} +
                                     config_.connect_timeout_ms);
  while (!ready_ && start_error_.ok() && cv_.WaitUntil(deadline)) {
  }
  if (!ready_ && start_error_.ok()) {
    return Status::Timeout("no node table from the scheduler at " +
                           config_.SchedulerAddress() + " within " +
                           std::to_string(config_.rendezvous_timeout_ms) +
                           " ms (PS_RENDEZVOUS_TIMEOUT_MS)");
  }
  if (!start_error_.ok()) return start_error_;
  // Peers of our domain say whether they mapped our probe (SHM_READY), so
  // that from the first request on we know where references may go. Without
  // an answer we only lose the shortcut: everything still goes by socket.
  deadline =
      Clock::now() + std::chrono::milliseconds(config_.rendezvous_timeout_ms);
  while (!shm_pending_.empty() && cv_.WaitUntil(deadline)) {
  }
  if (!shm_pending_.empty()) {
    std::string missing;
    for (int id : shm_pending_) missing += " " + table_.Describe(id);
    LOG(WARNING) << "no shared-memory answer from" << missing
                 << "; sending to them through the socket";
    shm_pending_.clear();
  }
  return Status::OK();
}

void Postoffice::SchedulerOnAddNode(const Message& msg) {
  const pb::Control& ctrl = msg.meta.control();
  if (ctrl.node_size() != 1 || ctrl.node(0).role() == pb::SCHEDULER ||
      !pb::NodeRole_IsValid(ctrl.node(0).role())) {
    CountDropped(msg.meta.sender(), "malformed ADD_NODE");
    return;
  }
  NodeInfo node = FromProto(ctrl.node(0));
  if (msg.from != node.Identity()) {
    // Its connection would not be the one we answer and later hear it on.
    van_.CountDropped(Van::DescribeConnection(msg.from, msg.peer_address),
                      "it registers as " + node.Address() +
                          ", not the address its connection is named after");
    return;
  }
  if (ctrl.rejoin()) return SchedulerOnMemberReport(msg, node);
  std::vector<Message> outbox;
  std::vector<PeerEvent> events;
  {
    MutexLock lock(&mu_);
    int have = static_cast<int>(
        std::count_if(arrivals_.begin(), arrivals_.end(),
                      [&](const NodeInfo& n) { return n.role == node.role; }));
    int want =
        node.role == Role::kServer ? config_.num_servers : config_.num_workers;
    Status st;
    if (ctrl.num_servers() != config_.num_servers ||
        ctrl.num_workers() != config_.num_workers) {
      st = Status::InvalidArgument(
          std::string("the ") + RoleName(node.role) + " at " + node.Address() +
          " was started for DMLC_NUM_SERVER=" +
          std::to_string(ctrl.num_servers()) +
          " DMLC_NUM_WORKER=" + std::to_string(ctrl.num_workers()) +
          ", the scheduler for DMLC_NUM_SERVER=" +
          std::to_string(config_.num_servers) + " DMLC_NUM_WORKER=" +
          std::to_string(config_.num_workers) + ": refused");
    } else if (ready_) {
      st = CheckRejoinLocked(node);
    } else if (have >= want) {
      st = Status::InvalidArgument(
          std::string("one ") + RoleName(node.role) +
          " too many: " + node.Address() + " registered after all " +
          std::to_string(want) + " expected had arrived");
    } else {
      st = CheckRequestedRank(node, arrivals_, config_.num_servers,
                              config_.num_workers);
    }
    const std::string connection =
        Van::DescribeConnection(msg.from, msg.peer_address);
    // A refusal is answered (so that a misconfigured node says why it
    // stops), but only so many times: each answer costs a connection.
    if (!st.ok() && ++refusals_answered_ > config_.num_servers +
                                               config_.num_workers +
                                               kMaxExtraRefusals) {
      van_.CountDropped(connection, "registration refused: " + st.message());
      return;
    }
    node.id = next_temp_id_--;
    Status connected = van_.Connect(node.id, node.host, node.port);
    if (!connected.ok()) {
      LOG(WARNING) << "cannot reach a registering " << RoleName(node.role)
                   << ": " << connected;
      return;
    }
    // The ACK answers this node, and goes first: a member waits for it
    // before it accepts a node table.
    outbox.push_back(ControlMessage(pb::ACK, node.id, false));
    if (!st.ok()) {
      van_.CountDropped(connection, "registration refused: " + st.message());
      Message reject = ControlMessage(pb::ADD_NODE, node.id, false);
      reject.meta.mutable_control()->set_error(st.message());
      reject.meta.mutable_control()->set_error_code(st.code());
      outbox.push_back(std::move(reject));
    } else if (ready_) {
      const int id = WorkerRankToId(node.requested_rank);
      Rejoin& r = rejoins_[id];
      r.node = node;
      r.temp_id = node.id;
      r.since = Clock::now();
      const bool awaited = membership_.state(id) == PeerState::kAwaited;
      LOG(INFO) << "a restart of " << table_.Describe(id) << " registered from "
                << node.Address()
                << (awaited
                        ? ""
                        : "; waiting for the old process to be declared dead");
      if (awaited) {
        StartRejoinLocked(id, &outbox, &events);
        outbox[0].meta.set_recver(id);  // the ACK: its connection is id's now
      }
    } else {
      arrivals_.push_back(node);
      if (config_.verbose >= 1) {
        LOG(INFO) << RoleName(node.role) << " at " << node.Address()
                  << " registered; " << RendezvousShortfallLocked();
      }
      if (static_cast<int>(arrivals_.size()) ==
          config_.num_servers + config_.num_workers) {
        // Ranks are assigned and connections rekeyed before the ACK leaves:
        // address it by the id this node was given.
        std::map<int, int> new_ids;
        std::vector<Message> table_msgs =
            CompleteRendezvousLocked(&new_ids, &events);
        outbox[0].meta.set_recver(new_ids.at(node.id));
        for (auto& m : table_msgs) outbox.push_back(std::move(m));
      }
    }
  }
  SendAll(&outbox);
  membership_.Publish(events);
}

void Postoffice::SchedulerOnMemberReport(const Message& msg,
                                         const NodeInfo& node) {
  const pb::Control& ctrl = msg.meta.control();
  const std::string connection =
      Van::DescribeConnection(msg.from, msg.peer_address);
  const int count =
      node.role == Role::kServer ? config_.num_servers : config_.num_workers;
  const int id = node.role == Role::kServer ? ServerRankToId(node.rank)
                                            : WorkerRankToId(node.rank);
  std::vector<Message> outbox;
  std::vector<PeerEvent> events;
  {
    MutexLock lock(&mu_);
    if (ctrl.num_servers() != config_.num_servers ||
        ctrl.num_workers() != config_.num_workers || node.rank < 0 ||
        node.rank >= count || node.id != id || config_.max_restarts == 0) {
      van_.CountDropped(connection,
                        "a member's report (" + node.Describe() +
                            ") that does not fit this job" +
                            (config_.max_restarts == 0
                                 ? " (a scheduler takes a running job over "
                                   "only with PS_MAX_RESTARTS > 0)"
                                 : ""));
      return;
    }
    const NodeInfo* known = table_.Find(id);
    if (ready_ || !arrivals_.empty()) {
      // Copies sent while we were not up yet are answered again; anything
      // else (a job that registers anew) is no report of ours.
      if (known != nullptr && known->HasIdentity(msg.from)) {
        Message back = ControlMessage(pb::ADD_NODE, id, false);
        back.meta.mutable_control()->set_rejoin(true);
        outbox.push_back(std::move(back));
      } else {
        van_.CountDropped(connection,
                          "a member's report, but this scheduler "
                          "did not restart a running job");
        return;
      }
    } else if (known == nullptr) {
      Status st = van_.Connect(id, node.host, node.port);
      if (!st.ok()) {
        LOG(WARNING) << "cannot reach " << node.Describe() << ": " << st;
        return;
      }
      table_.Add(node);
      TransitionLocked(id, PeerInput::kRegister,
                       "it reported to the restarted scheduler", &events);
      LOG(INFO) << node.Describe() << " reported to the restarted scheduler";
      if (static_cast<int>(table_.nodes().size()) ==
          1 + config_.num_servers + config_.num_workers) {
        rejoined_ = true;
        ready_ = true;
        for (const auto& [other, info] : table_.nodes()) {
          if (other == my_id_) continue;
          TransitionLocked(other, PeerInput::kAdmit,
                           "every member reported: the job goes on", &events);
          membership_.Watch(other, Clock::now());
          Message back = ControlMessage(pb::ADD_NODE, other, false);
          back.meta.mutable_control()->set_rejoin(true);
          outbox.push_back(std::move(back));
        }
        cv_.SignalAll();
        const std::string line =
            "the restarted scheduler took the running job over from its " +
            std::to_string(table_.nodes().size() - 1) + " members";
        LOG(INFO) << line;
        std::fprintf(stderr, "ps: %s\n", line.c_str());
      }
    }
  }
  SendAll(&outbox);
  membership_.Publish(events);
}

Message Postoffice::ReportToSchedulerLocked() const {
  Message msg = ControlMessage(pb::ADD_NODE, kSchedulerId, true);
  ToProto(*table_.Find(my_id_), msg.meta.mutable_control()->add_node());
  msg.meta.mutable_control()->set_rejoin(true);
  msg.meta.mutable_control()->set_num_servers(config_.num_servers);
  msg.meta.mutable_control()->set_num_workers(config_.num_workers);
  return msg;
}

void Postoffice::MemberOnSchedulerBack() {
  std::vector<Message> outbox;
  std::vector<PeerEvent> events;
  bool back;
  {
    MutexLock lock(&mu_);
    // It may not have been declared dead yet (the connection came back
    // before the watch's grace ran out): the barriers go again anyway (an
    // arrival counts once).
    back = membership_.state(kSchedulerId) == PeerState::kAwaited &&
           TransitionLocked(kSchedulerId, PeerInput::kRejoined,
                            "it answered this node's report", &events);
    membership_.Heard(kSchedulerId, Clock::now());
    for (const auto& [group, seen] : waiting_barriers_) {
      // Released meanwhile: its waiter just has not woken yet.
      if (barrier_released_[group] > seen) continue;
      Message msg = ControlMessage(pb::BARRIER, kSchedulerId, true);
      msg.meta.mutable_control()->set_barrier_group(group);
      outbox.push_back(std::move(msg));
    }
    cv_.SignalAll();
  }
  if (back) LOG(INFO) << "the scheduler is back (restarted)";
  SendAll(&outbox);
  membership_.Publish(events);
}

Status Postoffice::CheckRejoinLocked(const NodeInfo& node) const {
  const std::string who =
      std::string(RoleName(node.role)) + " at " + node.Address();
  if (config_.max_restarts == 0) {
    return Status::InvalidArgument(
        "one " + std::string(RoleName(node.role)) + " too many: " +
        node.Address() + " registered after all expected had arrived (a " +
        "restarted worker rejoins only with PS_MAX_RESTARTS > 0)");
  }
  if (node.role != Role::kWorker) {
    return Status::InvalidArgument("the " + who +
                                   " registered while the job runs: only "
                                   "restarted workers rejoin a running job");
  }
  if (node.requested_rank < 0 || node.requested_rank >= config_.num_workers) {
    return Status::InvalidArgument(
        "the " + who +
        " registered while the job runs without a worker rank (PS_RANK in "
        "[0, " +
        std::to_string(config_.num_workers) +
        ")): a restarted worker rejoins under its rank");
  }
  const int id = WorkerRankToId(node.requested_rank);
  auto it = rejoins_.find(id);
  if (it != rejoins_.end()) {
    return Status::InvalidArgument(
        "a restart of " + table_.Describe(id) + " is rejoining already (from " +
        it->second.node.Address() + "); " + who + " refused");
  }
  return Status::OK();
}

void Postoffice::StartRejoinLocked(int id, std::vector<Message>* outbox,
                                   std::vector<PeerEvent>* events) {
  Rejoin& r = rejoins_.at(id);
  r.started = true;
  NodeInfo node = r.node;
  node.id = id;
  node.rank = IdToRank(id);
  r.node = node;
  table_.Add(node);
  van_.Disconnect(id);  // the dead process's
  van_.Rekey(r.temp_id, id);
  TransitionLocked(id, PeerInput::kRejoin,
                   "its successor registered from " + node.Address(), events);
  membership_.Watch(id, Clock::now());
  r.started_at = Clock::now();
  for (const auto& [other, info] : table_.nodes()) {
    // Only the live are told: a successor still rejoining gets the new
    // address in its table.
    const PeerState state = membership_.state(other);
    if (other == id || other == my_id_ ||
        (state != PeerState::kLive && state != PeerState::kSuspected)) {
      continue;
    }
    Message msg = ControlMessage(pb::NODE_JOINED, other, true);
    ToProto(node, msg.meta.mutable_control()->add_node());
    outbox->push_back(std::move(msg));
    r.pending.insert(other);
  }
  if (r.pending.empty()) FinishRejoinLocked(id, outbox, events);
}

void Postoffice::FinishRejoinLocked(int id, std::vector<Message>* outbox,
                                    std::vector<PeerEvent>* events) {
  Message msg = ControlMessage(pb::ADD_NODE, id, false);
  for (const auto& [other, info] : table_.nodes()) {
    ToProto(info, msg.meta.mutable_control()->add_node());
  }
  msg.meta.mutable_control()->set_rejoin(true);
  for (PeerState down :
       {PeerState::kAwaited, PeerState::kDead, PeerState::kCovered}) {
    for (int other : membership_.InState(down)) {
      msg.meta.mutable_control()->add_dead(other);
    }
  }
  outbox->push_back(std::move(msg));
  const Rejoin& r = rejoins_.at(id);
  const double s =
      std::chrono::duration<double>(Clock::now() - r.since).count();
  char line[256];
  std::snprintf(line, sizeof(line),
                "%s rejoined the job (%.3f s after it registered)",
                table_.Describe(id).c_str(), s);
  LOG(INFO) << line;
  // The person running the job sees it on stderr (glog keeps INFO in files).
  std::fprintf(stderr, "ps: %s\n", line);
  rejoins_.erase(id);
  TransitionLocked(id, PeerInput::kRejoined, "every live member knows it",
                   events);
}

void Postoffice::SchedulerOnJoined(const Message& msg) {
  const pb::Control& ctrl = msg.meta.control();
  std::vector<Message> outbox;
  std::vector<PeerEvent> events;
  {
    MutexLock lock(&mu_);
    auto it = ctrl.node_size() == 1 ? rejoins_.find(ctrl.node(0).id())
                                    : rejoins_.end();
    // About this successor (a late answer may be about one that died).
    if (it == rejoins_.end() || !it->second.started ||
        FromProto(ctrl.node(0)).Identity() != it->second.node.Identity() ||
        it->second.pending.erase(msg.meta.sender()) == 0) {
      van_.CountDropped(table_.Describe(msg.meta.sender()),
                        "unexpected " + DebugString(msg));
      return;
    }
    if (it->second.pending.empty()) {
      FinishRejoinLocked(it->first, &outbox, &events);
    }
  }
  SendAll(&outbox);
  membership_.Publish(events);
}

void Postoffice::MemberOnNodeJoined(const Message& msg) {
  const pb::Control& ctrl = msg.meta.control();
  if (ctrl.node_size() != 1) {
    CountDropped(msg.meta.sender(), "NODE_JOINED without exactly one node");
    return;
  }
  NodeInfo node = FromProto(ctrl.node(0));
  std::string probe_error;
  bool probed = false;
  std::vector<PeerEvent> events;
  {
    MutexLock lock(&mu_);
    const NodeInfo* old = table_.Find(node.id);
    if (!ready_ || old == nullptr || old->role != Role::kWorker ||
        node.role != Role::kWorker || node.rank != old->rank) {
      van_.CountDropped("scheduler", "NODE_JOINED for no worker of ours: " +
                                         DebugString(msg));
      return;
    }
    table_.Add(node);
    TransitionLocked(node.id, PeerInput::kRejoined,
                     "the scheduler says its successor joined", &events);
    if (config_.role == Role::kServer) {  // servers talk to workers
      van_.Disconnect(node.id);
      Status st = van_.Connect(node.id, node.host, node.port);
      if (!st.ok()) {
        LOG(WARNING) << "cannot reach the restarted " << node.Describe() << ": "
                     << st;
      }
      if (!node.shm_domain.empty() && node.shm_domain == MyShmDomain()) {
        shm_pending_.insert(node.id);
        probe_error = ProbeSharedMemory(node);
        probed = true;
      }
    }
  }
  LOG(INFO) << node.Describe() << " rejoined the job";
  // The KV layer forgets the old process's requests (PeerRejoined) before
  // the new one can be heard (it hears the scheduler's table after our
  // answer).
  membership_.Publish(events);
  if (probed) {
    Message ready = ControlMessage(pb::SHM_READY, node.id, false);
    ready.meta.mutable_control()->set_error(probe_error);
    Status st = Send(&ready);
    if (!st.ok()) {
      LOG(WARNING) << "SHM_READY to " << node.Describe() << ": " << st;
    }
  }
  Message answer = ControlMessage(pb::NODE_JOINED, kSchedulerId, false);
  ToProto(node, answer.meta.mutable_control()->add_node());
  Send(&answer).IgnoreError();  // a lost answer: the scheduler's link died
}

std::vector<Message> Postoffice::CompleteRendezvousLocked(
    std::map<int, int>* new_ids, std::vector<PeerEvent>* events) {
  std::vector<NodeInfo> assigned = AssignRanks(arrivals_);
  CHECK_EQ(assigned.size(), arrivals_.size());
  for (size_t i = 0; i < assigned.size(); ++i) {
    (*new_ids)[arrivals_[i].id] = assigned[i].id;
    van_.Rekey(arrivals_[i].id, assigned[i].id);
    table_.Add(assigned[i]);
    const int id = assigned[i].id;
    TransitionLocked(id, PeerInput::kRegister,
                     "registered from " + assigned[i].Address(), events);
    TransitionLocked(id, PeerInput::kAdmit, "every member registered", events);
    membership_.Watch(id, Clock::now());
  }
  std::vector<Message> outbox;
  for (const NodeInfo& n : assigned) {
    Message msg = ControlMessage(pb::ADD_NODE, n.id, false);
    for (const auto& [id, info] : table_.nodes()) {
      ToProto(info, msg.meta.mutable_control()->add_node());
    }
    outbox.push_back(std::move(msg));
  }
  ready_ = true;
  cv_.SignalAll();
  if (config_.verbose >= 1) {
    for (const auto& [id, info] : table_.nodes()) {
      LOG(INFO) << "node table: id " << id << " = " << info.Describe();
    }
  }
  return outbox;
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
    if (ready_ && ctrl.rejoin() && ctrl.error().empty()) {
      lock.Unlock();
      return MemberOnSchedulerBack();
    }
    if (ready_) {
      van_.CountDropped("scheduler", "a second node table");
      return;
    }
    if (!ctrl.error().empty()) {
      start_error_ =
          Status(static_cast<Status::Code>(ctrl.error_code()), ctrl.error());
      if (start_error_.ok()) start_error_ = Status::Internal(ctrl.error());
      cv_.SignalAll();
      return;
    }
    NodeTable table;
    for (const pb::NodeInfo& p : ctrl.node()) table.Add(FromProto(p));
    const NodeInfo* me = table.Find(msg.meta.recver());
    if (me == nullptr || me->role != config_.role) {
      start_error_ = Status::Corruption("node table without this node");
      cv_.SignalAll();
      return;
    }
    // Workers talk to servers, servers to workers; all to the scheduler.
    // With replicas, a server also talks to its replica and its primary
    // (the forwarded pushes and their answers, by socket).
    int peers = config_.role == Role::kWorker ? kServerGroup : kWorkerGroup;
    std::vector<int> ids = table.Ids(peers);
    if (config_.role == Role::kServer && config_.replicas > 0) {
      const int n = config_.num_servers;
      std::set<int> others = {ServerRankToId(ReplicaOf(me->rank, n)),
                              ServerRankToId(PrimaryOf(me->rank, n))};
      for (int id : others) {
        const NodeInfo* other = table.Find(id);
        if (other == nullptr) continue;
        Status st = van_.Connect(id, other->host, other->port);
        if (!st.ok()) {
          start_error_ = st;
          cv_.SignalAll();
          return;
        }
      }
    }
    const std::set<int> dead_now(ctrl.dead().begin(), ctrl.dead().end());
    for (int id : ids) {
      if (dead_now.count(id) > 0) continue;  // a rejoin: it died meanwhile
      const NodeInfo* n = table.Find(id);
      Status st = van_.Connect(id, n->host, n->port);
      if (!st.ok()) {
        start_error_ = st;
        cv_.SignalAll();
        return;
      }
      if (!n->shm_domain.empty() && n->shm_domain == MyShmDomain()) {
        shm_pending_.insert(id);
        probed.emplace_back(id, ProbeSharedMemory(*n));
      }
    }
    my_id_ = me->id;
    my_rank_ = me->rank;
    rejoined_ = ctrl.rejoin();
    ImportMembershipLocked(table, {ctrl.dead().begin(), ctrl.dead().end()},
                           me->id);
    table_ = std::move(table);
    ready_ = true;
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

void Postoffice::ImportMembershipLocked(const NodeTable& table,
                                        const std::vector<int>& dead, int me) {
  // How things stand when this node joins: news to nobody here, so the
  // events are not published.
  std::vector<PeerEvent> events;
  membership_.set_self(me);
  for (const auto& [id, info] : table.nodes()) {
    TransitionLocked(id, PeerInput::kRegister, "in the node table", &events);
  }
  // A rejoining node learns who died meanwhile: servers whose replica took
  // over (requests for their keys go to it: TakenOver), workers awaited
  // back. Whether a server is covered depends on who else is dead.
  for (int id : dead) {
    if (table.Find(id) == nullptr || id == me) continue;
    TransitionLocked(
        id, RestartableLocked(id) ? PeerInput::kAwait : PeerInput::kLose,
        "dead when this node joined", &events);
  }
  for (int id : dead) {
    const int by = CoveringServerLocked(id);
    if (membership_.state(id) == PeerState::kDead && by >= 0) {
      TransitionLocked(id, PeerInput::kCover, "dead when this node joined",
                       &events, by);
    }
  }
  for (const auto& [id, info] : table.nodes()) {
    if (membership_.state(id) == PeerState::kJoining) {
      TransitionLocked(id, PeerInput::kAdmit, "in the node table", &events);
    }
  }
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
