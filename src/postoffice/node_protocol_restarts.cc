// NodeProtocol, continued: restarts (PS_MAX_RESTARTS). A restarted worker
// rejoins the running job under its predecessor's id (the scheduler's
// RejoinCoordinator: NODE_JOINED to the live members, then the node table
// to the successor); a restarted scheduler takes the running job over from
// its members' reports (TakeoverCoordinator).
#include <glog/logging.h>

#include <cstdio>
#include <utility>

#include "postoffice/logging.h"
#include "postoffice/node_protocol.h"

namespace ps {
namespace core {

namespace {
constexpr int kMaxLine = 256;
}  // namespace

// ---- A restarted worker, at the scheduler ----------------------------------

Status NodeProtocol::CheckRestart(const NodeInfo& node) const {
  return rejoins_.Check(node, [this](int id) { return table_.Describe(id); });
}

int NodeProtocol::RegisterRestart(const NodeInfo& node, Clock::time_point now,
                                  bool* started, Output* out) {
  At(now);
  const int id = rejoins_.Register(node, node.id, now);
  *started = membership_.state(id) == PeerState::kAwaited;
  out->lines.push_back(
      {Output::Line::kInfo,
       "a restart of " + table_.Describe(id) + " registered from " +
           node.Address() +
           (*started ? ""
                     : "; waiting for the old process to be declared dead")});
  if (*started) StartRejoin(id, out);
  return id;
}

void NodeProtocol::StartRejoin(int id, Output* out) {
  // Only the live are told: a successor still rejoining gets the new
  // address in its table.
  std::vector<int> tell;
  for (const auto& [other, info] : table_.nodes()) {
    const PeerState state = membership_.state(other);
    if (other != id && other != self_ &&
        (state == PeerState::kLive || state == PeerState::kSuspected)) {
      tell.push_back(other);
    }
  }
  const RejoinCoordinator::Started started = rejoins_.Start(id, tell, now_);
  const NodeInfo& node = started.node;
  table_.Add(node);
  out->disconnect.push_back(id);  // the dead process's
  out->rekey.push_back({started.temp_id, id});
  Apply(id, PeerInput::kRejoin,
        "its successor registered from " + node.Address(), out);
  membership_.Watch(id, now_);
  for (int other : tell) {
    Message msg = ControlMessage(pb::NODE_JOINED, other, true);
    ToProto(node, msg.meta.mutable_control()->add_node());
    out->messages.push_back(std::move(msg));
  }
  if (started.complete) FinishRejoin(id, out);
}

void NodeProtocol::FinishRejoin(int id, Output* out) {
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
  out->messages.push_back(std::move(msg));
  const double s = rejoins_.Finish(id, now_);
  char line[kMaxLine];
  std::snprintf(line, sizeof(line),
                "%s rejoined the job (%.3f s after it registered)",
                table_.Describe(id).c_str(), s);
  out->lines.push_back({Output::Line::kTell, line});
  Apply(id, PeerInput::kRejoined, "every live member knows it", out);
  // Its heartbeats start once it has the table: its silence counts from
  // now, not from its registration (a rejoin that waited long for the
  // members' answers would otherwise end in its death).
  membership_.Watch(id, now_);
}

void NodeProtocol::OnJoined(const pb::Meta& m, Output* out) {
  const pb::Control& ctrl = m.control();
  const RejoinCoordinator::Answer answer =
      ctrl.node_size() == 1
          ? rejoins_.Answered(m.sender(), FromProto(ctrl.node(0)))
          : RejoinCoordinator::Answer::kUnexpected;
  if (answer == RejoinCoordinator::Answer::kUnexpected) {
    out->drops.push_back(
        {m.sender(), "an answer to NODE_JOINED that no rejoin awaits"});
    return;
  }
  if (answer == RejoinCoordinator::Answer::kComplete) {
    FinishRejoin(ctrl.node(0).id(), out);
  }
}

void NodeProtocol::RejoinsOnEvent(const PeerEvent& e, Output* out) {
  if (e.kind != PeerEvent::kPeerLost && e.kind != PeerEvent::kPeerCovered) {
    return;
  }
  // The restarts under way wait no more for this node's answer; its own
  // successor may have registered before this death was known.
  std::vector<int> answered;
  const bool start_own = rejoins_.OnLost(
      e.id, e.from == PeerState::kRejoining,
      membership_.state(e.id) == PeerState::kAwaited, &answered);
  for (int rid : answered) FinishRejoin(rid, out);
  if (start_own) StartRejoin(e.id, out);
}

void NodeProtocol::RejoinTick(Clock::time_point now, Output* out) {
  // A rejoin whose members did not all answer within the connect timeout
  // goes ahead without them (their requests from the successor are
  // dropped until they learn its address; resends make that good). A
  // restart whose predecessor is never declared dead (it still answers
  // heartbeats) is refused, naming the one still alive.
  const int64_t wait_ms = std::max<int64_t>(
      config_.connect_timeout_ms, int64_t{config_.heartbeat_timeout_ms} + 1000);
  std::vector<RejoinCoordinator::Overdue> overdue;
  std::vector<RejoinCoordinator::Refused> refused;
  rejoins_.Tick(now, config_.connect_timeout_ms, wait_ms, &overdue, &refused);
  for (const RejoinCoordinator::Overdue& o : overdue) {
    std::string silent;
    for (int m : o.silent) silent += " " + table_.Describe(m);
    out->lines.push_back({Output::Line::kWarning,
                          "the rejoin of " + table_.Describe(o.id) +
                              " goes ahead without an answer from" + silent});
    FinishRejoin(o.id, out);
  }
  for (const RejoinCoordinator::Refused& r : refused) {
    const Status st = Status::InvalidArgument(
        "the worker at " + r.node.Address() + " registered as a restart of " +
        table_.Describe(r.id) + ", which is still alive after " +
        std::to_string(wait_ms) + " ms: refused");
    out->lines.push_back({Output::Line::kWarning, st.message()});
    Message reject = ControlMessage(pb::ADD_NODE, r.temp_id, false);
    reject.meta.mutable_control()->set_error(st.message());
    reject.meta.mutable_control()->set_error_code(st.code());
    out->messages.push_back(std::move(reject));
  }
}

// ---- A restarted worker, at a member ---------------------------------------

void NodeProtocol::OnNodeJoined(const pb::Meta& m, Output* out) {
  const pb::Control& ctrl = m.control();
  if (ctrl.node_size() != 1) {
    out->drops.push_back({m.sender(), "NODE_JOINED without exactly one node"});
    return;
  }
  const NodeInfo node = FromProto(ctrl.node(0));
  const NodeInfo* old = table_.Find(node.id);
  if (!ready_ || old == nullptr || old->role != Role::kWorker ||
      node.role != Role::kWorker || node.rank != old->rank) {
    out->drops.push_back({m.sender(), "NODE_JOINED for no worker of ours: " +
                                          std::to_string(node.id)});
    return;
  }
  table_.Add(node);
  out->routes_changed = true;  // its messages come from the new address
  Apply(node.id, PeerInput::kRejoined,
        "the scheduler says its successor joined", out);
  if (config_.role == Role::kServer) out->connect.push_back(node);
  out->lines.push_back(
      {Output::Line::kInfo, node.Describe() + " rejoined the job"});
  // The KV layer forgets the old process's requests (PeerRejoined) before
  // the new one can be heard (it hears the scheduler's table after this
  // answer).
  Message answer = ControlMessage(pb::NODE_JOINED, kSchedulerId, false);
  ToProto(node, answer.meta.mutable_control()->add_node());
  out->after_events.push_back(std::move(answer));
}

// ---- A restarted scheduler -------------------------------------------------

void NodeProtocol::OnReport(const NodeInfo& node,
                            const std::vector<NodeInfo>& covered, int servers,
                            int workers, bool running,
                            const std::string& connection,
                            Clock::time_point now, Output* out) {
  At(now);
  const Status st = takeover_.Check(node, covered, servers, workers);
  if (!st.ok()) {
    out->drops.push_back({node.id, st.message(), connection});
    return;
  }
  switch (takeover_.Classify(node, running || ready_, table_.Find(node.id))) {
    case TakeoverCoordinator::Outcome::kRefused:
      out->drops.push_back({node.id,
                            "a member's report, but this scheduler did not "
                            "restart a running job",
                            connection});
      return;
    case TakeoverCoordinator::Outcome::kCopy:
      return;
    case TakeoverCoordinator::Outcome::kAnswerAgain: {
      Message back = ControlMessage(pb::ADD_NODE, node.id, false);
      back.meta.mutable_control()->set_rejoin(true);
      out->messages.push_back(std::move(back));
      return;
    }
    case TakeoverCoordinator::Outcome::kNew:
      break;
  }
  if (takeover_.reported() == 0) first_report_ = now;
  out->connect.push_back(node);
  table_.Add(node);
  Apply(node.id, PeerInput::kRegister, "it reported to the restarted scheduler",
        out);
  out->lines.push_back(
      {Output::Line::kInfo,
       node.Describe() + " reported to the restarted scheduler"});
  if (!takeover_.Take(node, covered)) return;
  rejoined_ = true;
  TakeOver(takeover_.Covered(), out);
  const size_t gone = takeover_.Covered().size();
  out->lines.push_back(
      {Output::Line::kTell,
       "the restarted scheduler took the running job over from its " +
           std::to_string(takeover_.reported()) + " members" +
           (gone == 0 ? std::string()
                      : " (" + std::to_string(gone) +
                            " server(s) taken over by their replica)")});
}

void NodeProtocol::TakeOver(const std::vector<NodeInfo>& covered, Output* out) {
  ready_ = true;
  for (const auto& [other, info] : table_.nodes()) {
    if (other == self_) continue;
    Apply(other, PeerInput::kAdmit, "every member reported: the job goes on",
          out);
    membership_.Watch(other, now_);
    Message back = ControlMessage(pb::ADD_NODE, other, false);
    back.meta.mutable_control()->set_rejoin(true);
    out->messages.push_back(std::move(back));
  }
  // The servers taken over before: in the table (a restarted worker learns
  // of them), covered by their replica (barriers do not wait for them; a
  // later death is judged with them down).
  for (const NodeInfo& dead : covered) {
    table_.Add(dead);
    const int by =
        ServerRankToId(ReplicaOf(IdToRank(dead.id), config_.num_servers));
    Apply(dead.id, PeerInput::kRegister, "a member reported it taken over",
          out);
    Apply(dead.id, PeerInput::kCover,
          "taken over by " + table_.Describe(by) +
              " before the scheduler's restart, as its members report",
          out, by,
          Status::PeerFailed(table_.Describe(dead.id) +
                             " was taken over before the scheduler's "
                             "restart"));
  }
}

void NodeProtocol::TakeoverTick(Clock::time_point now, Output* out) {
  const int reported = takeover_.reported();
  const int job = config_.num_servers + config_.num_workers;
  if (ready_ || reported == 0 || takeover_.complete() ||
      2 * (reported + 1) <= job + 1 ||
      MsSince(first_report_, now) <= config_.heartbeat_timeout_ms) {
    return;
  }
  const std::vector<NodeInfo> missing = takeover_.MissingNodes();
  rejoined_ = true;
  TakeOver(takeover_.Covered(), out);
  out->lines.push_back(
      {Output::Line::kTell,
       "the restarted scheduler took the running job over from " +
           std::to_string(reported) + " of its " + std::to_string(job) +
           " members, a majority; " + takeover_.Missing() + " did not report"});
  std::vector<int> ids;
  for (const NodeInfo& node : missing) {
    table_.Add(node);
    Apply(node.id, PeerInput::kRegister, "the job's member, not reported", out);
    Apply(node.id, PeerInput::kAdmit, "the job's member, not reported", out);
    ids.push_back(node.id);
  }
  Declare(ids,
          "it did not report to the restarted scheduler within " +
              std::to_string(config_.heartbeat_timeout_ms) +
              " ms (PS_HEARTBEAT_TIMEOUT_MS), while " +
              std::to_string(reported) + " of the job's " +
              std::to_string(job) + " members did",
          out);
}

void NodeProtocol::OnSchedulerBack(Clock::time_point now, Output* out) {
  At(now);
  // It may not have been declared dead yet (the connection came back
  // before the watch's grace ran out): the barriers go again anyway (an
  // arrival counts once).
  if (membership_.state(kSchedulerId) == PeerState::kAwaited &&
      Apply(kSchedulerId, PeerInput::kRejoined,
            "it answered this node's report", out)) {
    out->lines.push_back(
        {Output::Line::kInfo, "the scheduler is back (restarted)"});
  }
  membership_.Heard(kSchedulerId, now);
  for (int group : barrier_waits_.ToResend()) {
    Message msg = ControlMessage(pb::BARRIER, kSchedulerId, true);
    msg.meta.mutable_control()->set_barrier_group(group);
    out->messages.push_back(std::move(msg));
  }
}

}  // namespace core
}  // namespace ps
