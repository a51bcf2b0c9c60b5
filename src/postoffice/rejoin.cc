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
#include <utility>

#include "postoffice/logging.h"
#include "postoffice/postoffice.h"

namespace ps {

void Postoffice::SchedulerOnMemberReport(const Message& msg,
                                         const NodeInfo& node) {
  const pb::Control& ctrl = msg.meta.control();
  const std::string connection =
      Van::DescribeConnection(msg.from, msg.peer_address);
  std::vector<Message> outbox;
  std::vector<PeerEvent> events;
  {
    MutexLock lock(&mu_);
    std::vector<NodeInfo> covered;
    for (const pb::NodeInfo& c : ctrl.covered())
      covered.push_back(FromProto(c));
    Status st =
        takeover_.Check(node, covered, ctrl.num_servers(), ctrl.num_workers());
    if (!st.ok()) {
      van_.CountDropped(connection, st.message());
      return;
    }
    const bool running = ready_ || !rendezvous_.arrivals().empty();
    switch (takeover_.Classify(node, running, table_.Find(node.id))) {
      case TakeoverCoordinator::Outcome::kRefused:
        van_.CountDropped(connection,
                          "a member's report, but this scheduler "
                          "did not restart a running job");
        return;
      case TakeoverCoordinator::Outcome::kCopy:
        return;
      case TakeoverCoordinator::Outcome::kAnswerAgain: {
        Message back = ControlMessage(pb::ADD_NODE, node.id, false);
        back.meta.mutable_control()->set_rejoin(true);
        outbox.push_back(std::move(back));
        break;
      }
      case TakeoverCoordinator::Outcome::kNew: {
        st = van_.Connect(node.id, node.host, node.port, node.wire_key);
        if (!st.ok()) {
          LOG(WARNING) << "cannot reach " << node.Describe() << ": " << st;
          return;
        }
        table_.Add(node);
        TransitionLocked(node.id, PeerInput::kRegister,
                         "it reported to the restarted scheduler", &events);
        LOG(INFO) << node.Describe() << " reported to the restarted scheduler";
        if (!takeover_.Take(node, covered)) break;
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
        // The servers taken over before: in the table (a restarted worker
        // learns of them), covered by their replica (barriers do not wait
        // for them; a later death is judged with them down).
        for (const NodeInfo& dead : takeover_.Covered()) {
          table_.Add(dead);
          const int by =
              ServerRankToId(ReplicaOf(IdToRank(dead.id), config_.num_servers));
          TransitionLocked(dead.id, PeerInput::kRegister,
                           "a member reported it taken over", &events);
          TransitionLocked(
              dead.id, PeerInput::kCover,
              "taken over by " + table_.Describe(by) +
                  " before the scheduler's restart, as its members report",
              &events, by,
              Status::PeerFailed(table_.Describe(dead.id) +
                                 " was taken over before the scheduler's "
                                 "restart"));
        }
        cv_.SignalAll();
        Tell(google::GLOG_INFO,
             "the restarted scheduler took the running job over from its " +
                 std::to_string(takeover_.reported()) + " members" +
                 (takeover_.Covered().empty()
                      ? std::string()
                      : " (" + std::to_string(takeover_.Covered().size()) +
                            " server(s) taken over by their replica)"));
        break;
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
  msg.meta.mutable_control()->set_job_token(config_.job_token);
  for (int id : membership_.InState(PeerState::kCovered)) {
    if (const NodeInfo* node = table_.Find(id)) {
      ToProto(*node, msg.meta.mutable_control()->add_covered());
    }
  }
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
    for (int group : barrier_waits_.ToResend()) {
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

void Postoffice::StartRejoinLocked(int id, std::vector<Message>* outbox,
                                   std::vector<PeerEvent>* events) {
  // Only the live are told: a successor still rejoining gets the new
  // address in its table.
  std::vector<int> tell;
  for (const auto& [other, info] : table_.nodes()) {
    const PeerState state = membership_.state(other);
    if (other != id && other != my_id_ &&
        (state == PeerState::kLive || state == PeerState::kSuspected)) {
      tell.push_back(other);
    }
  }
  const RejoinCoordinator::Started started =
      rejoins_.Start(id, tell, Clock::now());
  const NodeInfo& node = started.node;
  table_.Add(node);
  van_.Disconnect(id);  // the dead process's
  van_.Rekey(started.temp_id, id);
  TransitionLocked(id, PeerInput::kRejoin,
                   "its successor registered from " + node.Address(), events);
  membership_.Watch(id, Clock::now());
  for (int other : tell) {
    Message msg = ControlMessage(pb::NODE_JOINED, other, true);
    ToProto(node, msg.meta.mutable_control()->add_node());
    outbox->push_back(std::move(msg));
  }
  if (started.complete) FinishRejoinLocked(id, outbox, events);
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
  const double s = rejoins_.Finish(id, Clock::now());
  char line[256];
  std::snprintf(line, sizeof(line),
                "%s rejoined the job (%.3f s after it registered)",
                table_.Describe(id).c_str(), s);
  Tell(google::GLOG_INFO, line);
  TransitionLocked(id, PeerInput::kRejoined, "every live member knows it",
                   events);
}

void Postoffice::SchedulerOnJoined(const Message& msg) {
  const pb::Control& ctrl = msg.meta.control();
  std::vector<Message> outbox;
  std::vector<PeerEvent> events;
  {
    MutexLock lock(&mu_);
    const RejoinCoordinator::Answer answer =
        ctrl.node_size() == 1
            ? rejoins_.Answered(msg.meta.sender(), FromProto(ctrl.node(0)))
            : RejoinCoordinator::Answer::kUnexpected;
    if (answer == RejoinCoordinator::Answer::kUnexpected) {
      van_.CountDropped(table_.Describe(msg.meta.sender()),
                        "unexpected " + DebugString(msg));
      return;
    }
    if (answer == RejoinCoordinator::Answer::kComplete) {
      FinishRejoinLocked(ctrl.node(0).id(), &outbox, &events);
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
      Status st = van_.Connect(node.id, node.host, node.port, node.wire_key);
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
