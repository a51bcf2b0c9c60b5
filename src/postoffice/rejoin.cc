// Postoffice, continued: restarts (PS_MAX_RESTARTS) of a running job.
//
// A worker registering while the job runs is a restart of a dead one, under
// its rank (PS_RANK). Its registration waits until the old process is
// declared dead (the membership: awaited -> rejoining), then:
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
#include <chrono>
#include <cstdio>
#include <set>
#include <utility>

#include "postoffice/logging.h"
#include "postoffice/postoffice.h"

namespace ps {

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
    if (ready_ || !rendezvous_.arrivals().empty()) {
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
        Tell(google::GLOG_INFO, line);
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
  Tell(google::GLOG_INFO, line);
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
    PublishRoutesLocked();  // its messages come from the new address
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

}  // namespace ps
