// Postoffice, continued: a node's failure as a transition of the membership
// (DeclareDead, OnPeerFailure) and the subscribers that react to the
// membership's events, each in its own function.
#include <glog/logging.h>

#include <cstdio>
#include <string>
#include <utility>

#include "postoffice/postoffice.h"
#include "postoffice/replica_chain.h"

namespace ps {

namespace {
// "server 1", "worker 0", "scheduler": a node as the launcher names it.
std::string NodeName(int id) {
  if (IsServerId(id)) return "server " + std::to_string(IdToRank(id));
  if (IsWorkerId(id)) return "worker " + std::to_string(IdToRank(id));
  return "scheduler";
}
}  // namespace

namespace core {

void Postoffice::CollectPeerMetrics() const {
  const Clock::time_point now = Clock::now();
  for (const Membership::PeerView& p : membership_.Peers()) {
    metrics_->SetPeerState(p.id, PeerStateName(p.state));
    if (p.watched) {
      metrics_->SetHeartbeatAge(
          p.id, std::chrono::duration<double>(now - p.last_heard).count());
    }
  }
}

}  // namespace core

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void PrintEvent(const std::string& json) {
  std::fprintf(stderr, "ps-event: %s\n", json.c_str());
  std::fflush(stderr);
}

bool Postoffice::TransitionLocked(int id, PeerInput input,
                                  const std::string& why,
                                  std::vector<PeerEvent>* events, int by,
                                  const Status& status) {
  const bool was_down = membership_.IsDown(id);
  Status st = membership_.Apply(id, input, why, events, by, status);
  if (st.ok() && ready_ && membership_.IsDown(id) != was_down) {
    PublishRoutesLocked();  // the data path fences it, or no more
  }
  if (!st.ok()) {
    // A duplicate or a late word about a node (a second NODE_FAILED, a
    // goodbye after its death): nothing changes.
    VLOG(1) << st.message();
    return false;
  }
  cv_.SignalAll();
  return true;
}

Postoffice::Verdict Postoffice::VerdictLocked(int id) const {
  // Only a node awaited back dies twice: the second time for good.
  if (membership_.state(id) == PeerState::kAwaited) {
    return {PeerInput::kLose, -1};
  }
  if (RestartableLocked(id)) return {PeerInput::kAwait, -1};
  const int by = CoveringServerLocked(id);
  return by >= 0 ? Verdict{PeerInput::kCover, by}
                 : Verdict{PeerInput::kLose, -1};
}

void Postoffice::DeclareDead(const std::vector<int>& ids,
                             const std::string& why) {
  for (int id : ids) {
    std::vector<Message> outbox;
    Verdict verdict;
    {
      MutexLock lock(&mu_);
      // A worker awaited back (PS_MAX_RESTARTS) is declared dead again,
      // for good, when it did not come back in time.
      const PeerState state = membership_.state(id);
      if (IsScheduler() &&
          ((membership_.IsDown(id) && state != PeerState::kAwaited) ||
           state == PeerState::kDeparted || table_.Find(id) == nullptr)) {
        continue;
      }
      // The scheduler judges; its members apply the verdict it sends.
      verdict = VerdictLocked(id);
      if (IsScheduler()) outbox = NodeFailedLocked(id, why, verdict);
    }
    SendAll(&outbox);
    OnPeerFailure(id, why, verdict);
  }
}

std::vector<Message> Postoffice::NodeFailedLocked(int id,
                                                  const std::string& why,
                                                  const Verdict& verdict) {
  std::vector<Message> outbox;
  for (const auto& [other, node] : table_.nodes()) {
    if (other == id || other == my_id_ || membership_.IsDown(other) ||
        membership_.state(other) == PeerState::kDeparted) {
      continue;
    }
    Message msg = ControlMessage(pb::NODE_FAILED, other, false);
    pb::Control* ctrl = msg.meta.mutable_control();
    ToProto(*table_.Find(id), ctrl->add_node());
    ctrl->set_error(why);
    ctrl->set_verdict(verdict.input == PeerInput::kAwait   ? pb::AWAIT
                      : verdict.input == PeerInput::kCover ? pb::COVER
                                                           : pb::LOSE);
    if (verdict.input == PeerInput::kCover) ctrl->set_covered_by(verdict.by);
    outbox.push_back(std::move(msg));
  }
  return outbox;
}

void Postoffice::OnPeerFailure(int id, const std::string& why,
                               const Verdict& verdict) {
  std::vector<PeerEvent> events;
  {
    MutexLock lock(&mu_);
    const Status status =
        Status::PeerFailed(table_.Describe(id) + " was declared dead: " + why);
    if (!TransitionLocked(id, verdict.input, why, &events, verdict.by,
                          status)) {
      return;
    }
    if (verdict.input == PeerInput::kLose && peer_failure_.ok()) {
      peer_failure_ = status;
    }
  }
  membership_.Publish(events);
}

int Postoffice::CoveringServerLocked(int id) const {
  if (config_.replicas == 0 || !IsServerId(id)) return -1;
  const int rank = detail::CoveringServer(
      IdToRank(id), config_.num_servers,
      [this](int r) { return membership_.IsDown(ServerRankToId(r)); });
  return rank < 0 ? -1 : ServerRankToId(rank);
}

// ---- Subscribers -----------------------------------------------------------

void Postoffice::OnPeerEventForRejoins(const PeerEvent& e) {
  if (!IsScheduler() ||
      (e.kind != PeerEvent::kPeerLost && e.kind != PeerEvent::kPeerCovered)) {
    return;
  }
  std::vector<Message> outbox;
  std::vector<PeerEvent> events;
  {
    MutexLock lock(&mu_);
    // The restarts under way wait no more for this node's answer; its own
    // successor may have registered before this death was known.
    std::vector<int> answered;
    const bool start_own = rejoins_.OnLost(
        e.id, e.from == PeerState::kRejoining,
        membership_.state(e.id) == PeerState::kAwaited, &answered);
    for (int rid : answered) FinishRejoinLocked(rid, &outbox, &events);
    if (start_own) StartRejoinLocked(e.id, &outbox, &events);
  }
  SendAll(&outbox);
  membership_.Publish(events);
}

void Postoffice::OnPeerEventForBarriers(const PeerEvent& e) {
  if (!IsScheduler()) return;
  std::vector<Message> outbox;
  {
    MutexLock lock(&mu_);
    outbox = AnswerBarriersLocked(barriers_.OnPeerEvent(e));
  }
  SendAll(&outbox);
}

void Postoffice::OnPeerEventForLog(const PeerEvent& e) const {
  if (e.kind != PeerEvent::kPeerLost && e.kind != PeerEvent::kPeerCovered) {
    return;
  }
  if (IsScheduler()) {
    // The scheduler's verdict, for the launcher (docs/architecture.md).
    const bool covered = e.kind == PeerEvent::kPeerCovered;
    PrintEvent("{\"event\":\"dead\",\"node\":\"" + NodeName(e.id) + "\"" +
               (covered ? ",\"covered_by\":\"server " +
                              std::to_string(IdToRank(e.by)) + "\""
                        : "") +
               (e.awaited() ? ",\"awaited\":true" : "") + "}");
  }
  if (e.kind == PeerEvent::kPeerLost && !e.awaited()) {
    LOG(ERROR) << e.status;
    return;
  }
  const std::string line = e.kind == PeerEvent::kPeerCovered
                               ? e.status.message() + "; server " +
                                     std::to_string(IdToRank(e.by)) +
                                     " takes over its keys (PS_REPLICAS)"
                               : e.status.message() + "; the job waits up to " +
                                     std::to_string(config_.rejoin_timeout_ms) +
                                     " ms for it to rejoin (PS_MAX_RESTARTS)";
  LOG(WARNING) << line;
  // Where glog keeps warnings in its files, the person running the job
  // still sees the failover on stderr.
  if (!FLAGS_logtostderr && !FLAGS_alsologtostderr &&
      FLAGS_stderrthreshold > google::GLOG_WARNING) {
    std::fprintf(stderr, "ps: %s\n", line.c_str());
  }
}

void Postoffice::OnPeerEventForCustomers(const PeerEvent& e) {
  // What waits for a dead peer's acknowledgement is not sent again: not to
  // its successor (a restart's timestamps start afresh), nor into the
  // void; the KV layer resends to a replica itself.
  if (resender_ &&
      (e.kind == PeerEvent::kPeerRejoined || e.kind == PeerEvent::kPeerLost ||
       e.kind == PeerEvent::kPeerCovered)) {
    resender_->ForgetPeer(e.id);
  }
  if (e.kind == PeerEvent::kPeerRejoined) {
    // A member's KV layer forgets the old process's requests before the
    // new one can be heard (MemberOnNodeJoined answers after this).
    if (IsScheduler() || !IsWorkerId(e.id)) return;
    for (auto& c : Customers()) {
      if (c->on_join) c->on_join(e.id);
    }
    return;
  }
  if (e.kind != PeerEvent::kPeerLost && e.kind != PeerEvent::kPeerCovered) {
    return;
  }
  // The KV layer tells a death awaited back (Unavailable) from one for
  // good (PeerFailed): a DenseShard keeps waiting for the first.
  const Status told =
      e.awaited() ? Status::Unavailable(e.status.message() +
                                        "; awaited back (PS_MAX_RESTARTS)")
                  : e.status;
  for (auto& c : Customers()) {
    if (c->on_failure) c->on_failure(e.id, told);
  }
}

void Postoffice::OnPeerEventForUser(const PeerEvent& e) {
  if (e.kind != PeerEvent::kPeerLost || e.awaited()) return;
  std::function<void(int, const Status&)> handler;
  {
    MutexLock lock(&mu_);
    handler = peer_failure_handler_;
  }
  if (handler) handler(e.id, e.status);
}

}  // namespace ps
