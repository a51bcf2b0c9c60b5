// Postoffice, continued: the steps of the node protocol (TransitionLocked,
// DeclareDead, AfterStepLocked and Flush) and the subscribers that react to
// the membership's events, each in its own function.
#include <glog/logging.h>

#include <cstdio>
#include <string>
#include <utility>

#include "postoffice/logging.h"
#include "postoffice/postoffice.h"

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
  NodeProtocol::Output out;
  const bool taken =
      protocol_.Transition(id, input, why, Clock::now(), &out, by, status);
  AfterStepLocked(&out);
  for (PeerEvent& e : out.events) events->push_back(std::move(e));
  return taken;
}

void Postoffice::AfterStepLocked(NodeProtocol::Output* out) {
  for (int id : out->disconnect) van_.Disconnect(id);
  for (const NodeProtocol::Output::Rekey& r : out->rekey) {
    van_.Rekey(r.from, r.to);
  }
  std::vector<Message> probed;
  for (const NodeInfo& node : out->connect) {
    van_.Disconnect(node.id);
    Status st = van_.Connect(node.id, node.host, node.port, node.wire_key);
    if (!st.ok()) {
      LOG(WARNING) << "cannot reach " << node.Describe() << ": " << st;
      continue;
    }
    if (!IsScheduler() && !node.shm_domain.empty() &&
        node.shm_domain == MyShmDomain()) {
      // Whether we can map its memory goes to it before the answer that
      // lets it hear from us.
      shm_pending_.insert(node.id);
      Message ready = ControlMessage(pb::SHM_READY, node.id, false);
      ready.meta.mutable_control()->set_error(ProbeSharedMemory(node));
      probed.push_back(std::move(ready));
    }
  }
  out->after_events.insert(out->after_events.begin(),
                           std::make_move_iterator(probed.begin()),
                           std::make_move_iterator(probed.end()));
  out->disconnect.clear();
  out->rekey.clear();
  out->connect.clear();
  if (out->routes_changed) {
    PublishRoutesLocked();  // the data path fences it, or no more
    out->routes_changed = false;
  }
  cv_.SignalAll();
}

void Postoffice::Flush(NodeProtocol::Output* out) {
  for (const NodeProtocol::Output::Drop& d : out->drops) {
    if (d.connection.empty()) {
      CountDropped(d.sender, d.why);
    } else {
      van_.CountDropped(d.connection, d.why);
    }
  }
  SendAll(&out->messages);
  for (const NodeProtocol::Output::Line& line : out->lines) {
    switch (line.level) {
      case NodeProtocol::Output::Line::kInfo:
        LOG(INFO) << line.text;
        break;
      case NodeProtocol::Output::Line::kTell:
        Tell(google::GLOG_INFO, line.text);
        break;
      case NodeProtocol::Output::Line::kWarning:
        LOG(WARNING) << line.text;
        break;
      case NodeProtocol::Output::Line::kError:
        LOG(ERROR) << line.text;
        break;
    }
  }
  membership_.Publish(out->events);
  SendAll(&out->after_events);
  out->drops.clear();
  out->lines.clear();
  out->events.clear();
}

void Postoffice::DeclareDead(const std::vector<int>& ids,
                             const std::string& why) {
  NodeProtocol::Output out;
  {
    MutexLock lock(&mu_);
    protocol_.DeclareDead(ids, why, Clock::now(), &out);
    AfterStepLocked(&out);
  }
  Flush(&out);
}

// ---- Subscribers -----------------------------------------------------------

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
  // A member's KV layer forgets a rejoined worker's old process before the
  // new one can be heard (NodeProtocol::OnNodeJoined's answer waits for
  // this).
  const bool rejoined =
      e.kind == PeerEvent::kPeerRejoined && !IsScheduler() && IsWorkerId(e.id);
  if (!rejoined && e.kind != PeerEvent::kPeerLost &&
      e.kind != PeerEvent::kPeerCovered) {
    return;
  }
  for (auto& c : Customers()) {
    if (c->on_event) c->on_event(e);
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
