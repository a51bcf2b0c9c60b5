// BarrierCoordinator: the scheduler's barriers (barrier_coordinator.h).
#include "postoffice/barrier_coordinator.h"

#include "postoffice/logging.h"
#include "postoffice/node_table.h"

namespace ps {
namespace core {

std::vector<BarrierCoordinator::Release> BarrierCoordinator::Arrive(
    int group, int sender, Clock::time_point now) {
  Barrier& b = barriers_[group];
  if (b.arrived.empty()) b.started = b.reported = now;
  b.arrived.insert(sender);
  for (int id : members_.ids(group)) {
    // A worker that may yet rejoin is waited for (it comes back under its
    // id); PS_REJOIN_TIMEOUT_MS bounds that.
    if (members_.state(id) == PeerState::kDead) {
      return {
          Take(group, Status::PeerFailed("barrier of " + GroupName(group) +
                                         " cannot complete: " +
                                         members_.describe(id) + " is dead"))};
    }
  }
  if (Complete(group)) return {Take(group, Status::OK())};
  return {};
}

std::vector<BarrierCoordinator::Release> BarrierCoordinator::OnPeerEvent(
    const PeerEvent& e) {
  const bool lost = e.kind == PeerEvent::kPeerLost && !e.awaited();
  if (!lost && e.kind != PeerEvent::kPeerCovered) return {};
  std::vector<int> stuck;
  for (const auto& [group, b] : barriers_) {
    if (GroupContains(group, e.id)) stuck.push_back(group);
  }
  std::vector<Release> releases;
  for (int group : stuck) {
    if (lost) {
      releases.push_back(
          Take(group,
               Status::PeerFailed("barrier of " + GroupName(group) +
                                  " cannot complete: " + e.status.message())));
    } else if (Complete(group)) {
      // A server whose replica took over is not waited for.
      releases.push_back(Take(group, Status::OK()));
    }
  }
  return releases;
}

std::vector<BarrierCoordinator::Release> BarrierCoordinator::Tick(
    Clock::time_point now) {
  std::vector<int> expired;
  for (const auto& [group, b] : barriers_) {
    if (MsSince(b.started, now) > timeout_ms_) expired.push_back(group);
  }
  std::vector<Release> releases;
  for (int group : expired) {
    const std::string missing = Missing(group);
    releases.push_back(Take(
        group,
        Status::Timeout("barrier of " + GroupName(group) + " timed out after " +
                        std::to_string(timeout_ms_) +
                        " ms (PS_BARRIER_TIMEOUT_MS); missing: " + missing)));
  }
  return releases;
}

std::vector<BarrierCoordinator::Report> BarrierCoordinator::Reports(
    Clock::time_point now) {
  std::vector<Report> reports;
  for (auto& [group, b] : barriers_) {
    if (MsSince(b.reported, now) < report_ms_) continue;
    b.reported = now;
    const int64_t waited = MsSince(b.started, now);
    const size_t members = members_.ids(group).size();
    reports.push_back({group, waited,
                       "barrier of " + GroupName(group) + ": waiting " +
                           Seconds(waited) + " for " + Missing(group) + " (" +
                           std::to_string(b.arrived.size()) + " of " +
                           std::to_string(members) +
                           " arrived; PS_BARRIER_TIMEOUT_MS=" +
                           std::to_string(timeout_ms_) + ")"});
  }
  return reports;
}

std::string BarrierCoordinator::Missing(int group) const {
  const std::set<int>& arrived = barriers_.at(group).arrived;
  std::string missing;
  for (int id : members_.ids(group)) {
    const PeerState state = members_.state(id);
    if (arrived.count(id) > 0 || state == PeerState::kCovered) continue;
    missing += (missing.empty() ? "" : ", ") + members_.describe(id);
    if (state == PeerState::kSuspected || state == PeerState::kAwaited ||
        state == PeerState::kRejoining || state == PeerState::kDead) {
      missing += std::string(" (") + PeerStateName(state) + ")";
    }
  }
  return missing;
}

bool BarrierCoordinator::Complete(int group) const {
  const std::set<int>& arrived = barriers_.at(group).arrived;
  for (int id : members_.ids(group)) {
    if (members_.state(id) != PeerState::kCovered && arrived.count(id) == 0) {
      return false;
    }
  }
  return true;
}

BarrierCoordinator::Release BarrierCoordinator::Take(int group,
                                                     const Status& status) {
  auto it = barriers_.find(group);
  Release release{
      group, status,
      std::vector<int>(it->second.arrived.begin(), it->second.arrived.end())};
  barriers_.erase(it);
  return release;
}

}  // namespace core
}  // namespace ps
