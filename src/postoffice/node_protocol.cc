// NodeProtocol: liveness, deaths and their verdicts, barriers and goodbyes
// as one state machine without I/O (node_protocol.h).
#include "postoffice/node_protocol.h"

#include <glog/logging.h>

#include <algorithm>
#include <string>
#include <utility>

#include "postoffice/logging.h"
#include "postoffice/replica_chain.h"

namespace ps {
namespace core {

namespace {
constexpr int kSchedulerTickMs = 100;
// A control wait reports itself once per this many heartbeat timeouts.
constexpr int kReportHeartbeatTimeouts = 4;

pb::Verdict ToProto(PeerInput input) {
  return input == PeerInput::kAwait   ? pb::AWAIT
         : input == PeerInput::kCover ? pb::COVER
                                      : pb::LOSE;
}
}  // namespace

NodeProtocol::NodeProtocol(const Config& config)
    : config_(config),
      barriers_({[this](int group) { return table_.Ids(group); },
                 [this](int id) { return membership_.state(id); },
                 [this](int id) { return table_.Describe(id); }},
                config.barrier_timeout_ms, ReportEveryMs(config)),
      rejoins_(config.num_workers, config.max_restarts),
      takeover_(config.num_servers, config.num_workers, config.max_restarts) {
  const int interval = config_.heartbeat_interval_ms;
  tick_ms_ = IsScheduler() ? kSchedulerTickMs : std::max(interval, 0);
  // Resends are due at PS_RESEND_TIMEOUT_MS granularity: tick at least
  // twice as often (heartbeats still go once per interval).
  if (config_.resend_timeout_ms > 0) {
    const int resend_tick = std::max(1, config_.resend_timeout_ms / 2);
    tick_ms_ = tick_ms_ == 0 ? resend_tick : std::min(tick_ms_, resend_tick);
  }
}

void NodeProtocol::set_self(int id) {
  self_ = id;
  membership_.set_self(id);
}

int64_t NodeProtocol::ReportEveryMs(const Config& config) {
  return std::max<int64_t>(
      100, int64_t{kReportHeartbeatTimeouts} * config.heartbeat_timeout_ms);
}

Message NodeProtocol::ControlMessage(pb::Command cmd, int recver,
                                     bool request) {
  Message msg;
  msg.meta.mutable_control()->set_cmd(cmd);
  msg.meta.set_recver(recver);
  msg.meta.set_request(request);
  return msg;
}

void NodeProtocol::RegisterSelf(const NodeInfo& me, Clock::time_point now) {
  At(now);
  table_.Add(me);
  set_self(me.id);
  Output ignored;  // about itself: nobody to tell
  Apply(me.id, PeerInput::kRegister, "it starts", &ignored);
  Apply(me.id, PeerInput::kAdmit, "it starts", &ignored);
}

void NodeProtocol::AdmitAll(const std::vector<NodeInfo>& assigned,
                            Clock::time_point now, Output* out) {
  At(now);
  for (const NodeInfo& n : assigned) {
    table_.Add(n);
    Apply(n.id, PeerInput::kRegister, "registered from " + n.Address(), out);
    Apply(n.id, PeerInput::kAdmit, "every member registered", out);
    membership_.Watch(n.id, now);
  }
  for (const NodeInfo& n : assigned) {
    Message msg = ControlMessage(pb::ADD_NODE, n.id, false);
    for (const auto& [id, info] : table_.nodes()) {
      ToProto(info, msg.meta.mutable_control()->add_node());
    }
    out->messages.push_back(std::move(msg));
  }
  ready_ = true;
}

void NodeProtocol::Import(NodeTable table, const std::vector<int>& dead, int me,
                          Clock::time_point now) {
  At(now);
  table_ = std::move(table);
  set_self(me);
  Output ignored;
  for (const auto& [id, info] : table_.nodes()) {
    Apply(id, PeerInput::kRegister, "in the node table", &ignored);
  }
  // A rejoining node learns who died meanwhile: servers whose replica took
  // over (requests for their keys go to it), workers awaited back. Whether
  // a server is covered depends on who else is dead.
  for (int id : dead) {
    if (table_.Find(id) == nullptr || id == me) continue;
    Apply(id, Restartable(id) ? PeerInput::kAwait : PeerInput::kLose,
          "dead when this node joined", &ignored);
  }
  for (int id : dead) {
    const int by = CoveringServer(id);
    if (membership_.state(id) == PeerState::kDead && by >= 0) {
      Apply(id, PeerInput::kCover, "dead when this node joined", &ignored, by);
    }
  }
  for (const auto& [id, info] : table_.nodes()) {
    if (membership_.state(id) == PeerState::kJoining) {
      Apply(id, PeerInput::kAdmit, "in the node table", &ignored);
    }
  }
  ready_ = true;
}

// ---- Deaths and verdicts ---------------------------------------------------

bool NodeProtocol::Transition(int id, PeerInput input, const std::string& why,
                              Clock::time_point now, Output* out, int by,
                              const Status& status) {
  At(now);
  return Apply(id, input, why, out, by, status);
}

bool NodeProtocol::Apply(int id, PeerInput input, const std::string& why,
                         Output* out, int by, const Status& status) {
  const bool was_down = membership_.IsDown(id);
  Status st = membership_.Apply(id, input, why, &out->events, by, status);
  if (!st.ok()) {
    // A duplicate or a late word about a node (a second NODE_FAILED, a
    // goodbye after its death): nothing changes.
    VLOG(1) << st.message();
    return false;
  }
  // The routes hold each down node's state and who covers it: a change of
  // either, or of whether it is down, is published.
  if (ready_ && (was_down || membership_.IsDown(id))) {
    out->routes_changed = true;
  }
  return true;
}

bool NodeProtocol::Restartable(int id) const {
  return config_.max_restarts > 0 &&
         (IsWorkerId(id) || (id == kSchedulerId && !IsScheduler()));
}

int NodeProtocol::CoveringServer(int id) const {
  if (config_.replicas == 0 || !IsServerId(id)) return -1;
  const int rank = detail::CoveringServer(
      IdToRank(id), config_.num_servers,
      [this](int r) { return membership_.IsDown(ServerRankToId(r)); });
  return rank < 0 ? -1 : ServerRankToId(rank);
}

NodeProtocol::Verdict NodeProtocol::VerdictOf(int id) const {
  // Only a node awaited back dies twice: the second time for good.
  if (membership_.state(id) == PeerState::kAwaited) {
    return {PeerInput::kLose, -1};
  }
  if (Restartable(id)) return {PeerInput::kAwait, -1};
  const int by = CoveringServer(id);
  return by >= 0 ? Verdict{PeerInput::kCover, by}
                 : Verdict{PeerInput::kLose, -1};
}

void NodeProtocol::DeclareDead(const std::vector<int>& ids,
                               const std::string& why, Clock::time_point now,
                               Output* out) {
  At(now);
  Declare(ids, why, out);
}

void NodeProtocol::Declare(const std::vector<int>& ids, const std::string& why,
                           Output* out) {
  for (int id : ids) {
    // A worker awaited back (PS_MAX_RESTARTS) is declared dead again, for
    // good, when it did not come back in time.
    const PeerState state = membership_.state(id);
    if (IsScheduler() &&
        ((membership_.IsDown(id) && state != PeerState::kAwaited) ||
         state == PeerState::kDeparted || table_.Find(id) == nullptr)) {
      continue;
    }
    // The scheduler judges; its members apply the verdict it sends.
    const Verdict verdict = VerdictOf(id);
    if (IsScheduler()) SendNodeFailed(id, why, verdict, out);
    ApplyVerdict(id, why, verdict, out);
  }
}

void NodeProtocol::SendNodeFailed(int id, const std::string& why,
                                  const Verdict& verdict, Output* out) const {
  for (const auto& [other, node] : table_.nodes()) {
    if (other == id || other == self_ || membership_.IsDown(other) ||
        membership_.state(other) == PeerState::kDeparted) {
      continue;
    }
    Message msg = ControlMessage(pb::NODE_FAILED, other, false);
    pb::Control* ctrl = msg.meta.mutable_control();
    ToProto(*table_.Find(id), ctrl->add_node());
    ctrl->set_error(why);
    ctrl->set_verdict(ToProto(verdict.input));
    if (verdict.input == PeerInput::kCover) ctrl->set_covered_by(verdict.by);
    out->messages.push_back(std::move(msg));
  }
}

void NodeProtocol::ApplyVerdict(int id, const std::string& why,
                                const Verdict& verdict, Output* out) {
  const Status status =
      Status::PeerFailed(table_.Describe(id) + " was declared dead: " + why);
  const size_t first = out->events.size();
  if (!Apply(id, verdict.input, why, out, verdict.by, status)) return;
  if (verdict.input == PeerInput::kLose && peer_failure_.ok()) {
    peer_failure_ = status;
  }
  ReactToEvents(first, out);
}

void NodeProtocol::ReactToEvents(size_t first, Output* out) {
  if (!IsScheduler()) return;
  // By index: the reactions append events of their own (a rejoin that
  // finishes).
  for (size_t i = first; i < out->events.size(); ++i) {
    const PeerEvent e = out->events[i];
    RejoinsOnEvent(e, out);
    AnswerBarriers(barriers_.OnPeerEvent(e), out);
  }
}

void NodeProtocol::OnNodeFailed(const pb::Meta& m, Output* out) {
  const pb::Control& ctrl = m.control();
  if (IsScheduler() || m.sender() != kSchedulerId) {
    // A member that holds the job's key may send anything under its own
    // name, but only the scheduler judges a death.
    out->drops.push_back(
        {m.sender(),
         "NODE_FAILED not from the scheduler: only the scheduler "
         "judges a death"});
    return;
  }
  if (ctrl.node_size() != 1) {
    out->drops.push_back({m.sender(), "NODE_FAILED without exactly one node"});
    return;
  }
  const int dead = ctrl.node(0).id();
  Verdict verdict;
  switch (ctrl.verdict()) {
    case pb::LOSE:
      break;
    case pb::AWAIT:
      verdict.input = PeerInput::kAwait;
      break;
    case pb::COVER:
      verdict = {PeerInput::kCover, ctrl.covered_by()};
      if (IsServerId(verdict.by) && verdict.by != dead) break;
      [[fallthrough]];
    default:
      out->drops.push_back(
          {m.sender(), "NODE_FAILED of node " + std::to_string(dead) +
                           " with verdict " + std::to_string(ctrl.verdict()) +
                           " covered by " + std::to_string(ctrl.covered_by()) +
                           ": a verdict must be LOSE, AWAIT or COVER by "
                           "another server"});
      return;
  }
  ApplyVerdict(dead, ctrl.error(), verdict, out);
}

void NodeProtocol::OnConnectionLost(int id, const std::string& why,
                                    Clock::time_point now, Output* out) {
  At(now);
  // A restart that died while its registration waited: forgotten, so that
  // the next one is not refused as a second.
  NodeInfo gone;
  const int restarted = rejoins_.OnConnectionLost(id, &gone);
  if (restarted >= 0) {
    out->lines.push_back({Output::Line::kWarning,
                          "the restart of " + table_.Describe(restarted) +
                              " registered from " + gone.Address() +
                              " is gone: " + why});
    out->disconnect.push_back(id);
    return;
  }
  // Before the node table a member's absence is rendezvous' business; a
  // member that said goodbye (TERMINATE) leaves without blame, and so does
  // the scheduler once this member finalized (it may end first).
  if (!ready_ || table_.Find(id) == nullptr || membership_.IsDown(id) ||
      membership_.state(id) == PeerState::kDeparted ||
      (!IsScheduler() && finalized_)) {
    return;
  }
  // A connection lost is evidence of a death only while the scheduler
  // hears a majority: one cut off from the job loses every connection
  // (ZeroMQ's heartbeat closes them, its routes fail the reconnects), and
  // that proves nothing about the members.
  std::string count;
  std::string unheard;
  if (IsScheduler() &&
      (!HearsMajority({id}, &count, &unheard) || withholding_)) {
    out->lines.push_back(
        {Output::Line::kWarning,
         table_.Describe(id) + " was not declared dead though " + why + ": " +
             count +
             ", so its silence is judged only once a majority is heard"});
    return;
  }
  Declare({id}, why, out);
}

// ---- Messages of peers -----------------------------------------------------

bool NodeProtocol::OnProven(int sender, pb::Command cmd, Clock::time_point now,
                            Output* out) {
  At(now);
  // The scheduler watches every member, a member the scheduler only.
  if (IsScheduler() || sender == kSchedulerId) {
    membership_.Heard(sender, now);
  } else if (!membership_.IsDown(sender)) {
    last_peer_ = sender;
    last_peer_at_ = now;
  }
  if (IsScheduler() && membership_.IsDown(sender) && cmd == pb::HEARTBEAT) {
    // It was frozen and came back: tell it, so that it names itself.
    Message dead = ControlMessage(pb::NODE_FAILED, sender, false);
    ToProto(*table_.Find(sender), dead.meta.mutable_control()->add_node());
    dead.meta.mutable_control()->set_error(
        "the scheduler declared it dead earlier");
    dead.meta.mutable_control()->set_verdict(pb::LOSE);
    out->messages.push_back(std::move(dead));
  }
  // Fencing: a node declared dead (frozen, or cut off, and back) is out of
  // the job, and what it sends is of a job that went on without it: its
  // data are dropped, whatever layer they are for. Its control messages
  // still come (the scheduler tells it, above). A restarted worker's
  // successor is another connection, proven once it rejoined.
  return cmd == pb::EMPTY && membership_.IsDown(sender);
}

bool NodeProtocol::Takes(pb::Command cmd) {
  return cmd == pb::HEARTBEAT || cmd == pb::BARRIER || cmd == pb::NODE_FAILED ||
         cmd == pb::TERMINATE || cmd == pb::NODE_JOINED;
}

void NodeProtocol::OnControl(const pb::Meta& m, Clock::time_point now,
                             Output* out) {
  At(now);
  switch (m.control().cmd()) {
    case pb::HEARTBEAT:
      return OnHeartbeat(m, out);
    case pb::BARRIER:
      return OnBarrier(m, now, out);
    case pb::NODE_FAILED:
      return OnNodeFailed(m, out);
    case pb::TERMINATE:
      return OnGoodbye(m, out);
    case pb::NODE_JOINED:
      if (IsScheduler() && !m.request()) return OnJoined(m, out);
      if (!IsScheduler() && m.request() && m.sender() == kSchedulerId) {
        return OnNodeJoined(m, out);
      }
      out->drops.push_back({m.sender(), "unexpected NODE_JOINED"});
      return;
    default:
      out->drops.push_back({m.sender(), "unexpected command " +
                                            std::to_string(m.control().cmd())});
  }
}

void NodeProtocol::OnHeartbeat(const pb::Meta& m, Output* out) {
  // A lost answer is what heartbeats are there to notice. (One answered
  // with its death above is answered no more.)
  if (IsScheduler() && m.request() && !membership_.IsDown(m.sender())) {
    out->messages.push_back(ControlMessage(pb::HEARTBEAT, m.sender(), false));
  }
}

void NodeProtocol::OnGoodbye(const pb::Meta& m, Output* out) {
  if (!IsScheduler()) return;
  if (!m.control().error().empty()) {
    Declare({m.sender()}, m.control().error(), out);
    return;
  }
  const size_t first = out->events.size();
  if (Apply(m.sender(), PeerInput::kDepart, "it finalized", out)) {
    ReactToEvents(first, out);
  }
}

// ---- Barriers --------------------------------------------------------------

BarrierWaits::Ticket NodeProtocol::EnterBarrier(int group,
                                                Clock::time_point now,
                                                Output* out) {
  At(now);
  const BarrierWaits::Ticket ticket = barrier_waits_.Enter(group);
  if (IsScheduler()) {
    AnswerBarriers(barriers_.Arrive(group, self_, now), out);
  } else if (membership_.state(kSchedulerId) != PeerState::kAwaited) {
    // (Sent when the scheduler comes back if it is awaited: restarts.)
    Message msg = ControlMessage(pb::BARRIER, kSchedulerId, true);
    msg.meta.mutable_control()->set_barrier_group(group);
    out->messages.push_back(std::move(msg));
  }
  return ticket;
}

void NodeProtocol::OnBarrier(const pb::Meta& m, Clock::time_point now,
                             Output* out) {
  const int group = m.control().barrier_group();
  if (IsScheduler() && m.request()) {
    if (!GroupContains(group, m.sender()) || group <= 0 || group > kAllGroups) {
      out->drops.push_back(
          {m.sender(),
           "barrier for group " + std::to_string(group) + " it is not in"});
      return;
    }
    AnswerBarriers(barriers_.Arrive(group, m.sender(), now), out);
  } else if (!IsScheduler() && !m.request()) {
    const pb::Control& c = m.control();
    barrier_waits_.Release(
        group,
        c.error().empty()
            ? Status::OK()
            : Status(static_cast<Status::Code>(c.error_code()), c.error()));
  }
}

void NodeProtocol::AnswerBarriers(
    const std::vector<BarrierCoordinator::Release>& releases, Output* out) {
  for (const BarrierCoordinator::Release& r : releases) {
    for (int id : r.arrived) {
      if (id == self_) {
        barrier_waits_.Release(r.group, r.status);
        continue;
      }
      Message msg = ControlMessage(pb::BARRIER, id, false);
      msg.meta.mutable_control()->set_barrier_group(r.group);
      msg.meta.mutable_control()->set_error(r.status.message());
      msg.meta.mutable_control()->set_error_code(r.status.code());
      out->messages.push_back(std::move(msg));
    }
    if (!r.status.ok())
      out->lines.push_back({Output::Line::kError, r.status.ToString()});
  }
}

std::string NodeProtocol::BarrierWaitLine(int group, int64_t waited) const {
  // The scheduler's coordinator names who has not arrived.
  if (IsScheduler()) return "";
  const std::string line = "barrier of " + GroupName(group) + ": " +
                           table_.Describe(self_) + " has waited " +
                           Seconds(waited);
  if (membership_.state(kSchedulerId) == PeerState::kAwaited) {
    return line + " for the scheduler at " + config_.SchedulerAddress() +
           " to come back (restarted; PS_REJOIN_TIMEOUT_MS=" +
           std::to_string(config_.rejoin_timeout_ms) + ")";
  }
  return line + " for the scheduler's release (the scheduler's log names " +
         "who has not arrived; PS_BARRIER_TIMEOUT_MS=" +
         std::to_string(config_.barrier_timeout_ms) + ")";
}

std::string NodeProtocol::Staying() const {
  std::string who;
  for (const auto& [id, node] : table_.nodes()) {
    const PeerState state = membership_.state(id);
    if (id == self_ || state == PeerState::kDeparted ||
        state == PeerState::kDead || state == PeerState::kAwaited ||
        state == PeerState::kCovered) {
      continue;
    }
    who += (who.empty() ? "" : ", ") + table_.Describe(id);
  }
  return who;
}

Message NodeProtocol::ReportToScheduler() const {
  Message msg = ControlMessage(pb::ADD_NODE, kSchedulerId, true);
  ToProto(*table_.Find(self_), msg.meta.mutable_control()->add_node());
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

// ---- The monitor's timer ---------------------------------------------------

}  // namespace core
}  // namespace ps
