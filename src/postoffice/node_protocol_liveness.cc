// NodeProtocol's liveness (node_protocol.h): the monitor's tick, who is
// silent past the heartbeat timeout, and whether the scheduler may judge
// that silence: only while it hears a majority of the job (the quorum
// rule, docs/failures.md "Who may declare whom dead").
#include <algorithm>
#include <string>
#include <vector>

#include "postoffice/logging.h"
#include "postoffice/node_protocol.h"

namespace ps {
namespace core {

void NodeProtocol::Start(Clock::time_point now) {
  At(now);
  last_tick_ = last_heartbeat_ = now;
  if (!IsScheduler()) membership_.Watch(kSchedulerId, now);
}

bool NodeProtocol::ReportDue(Clock::time_point since, Clock::time_point prev,
                             Clock::time_point now) const {
  const int64_t every = ReportEveryMs(config_);
  return MsSince(since, now) / every >
         std::max<int64_t>(0, MsSince(since, prev)) / every;
}

void NodeProtocol::Tick(Clock::time_point now, Output* out) {
  At(now);
  const int interval = config_.heartbeat_interval_ms;
  const int64_t gap = MsSince(last_tick_, now);
  if (interval > 0 && gap > config_.heartbeat_timeout_ms) {
    // This node itself was stopped (SIGSTOP, a debugger) or starved of
    // CPU: the silence it sees is its own, so it blames nobody for it.
    out->lines.push_back(
        {Output::Line::kWarning, table_.Describe(self_) + " was stalled for " +
                                     std::to_string(gap) +
                                     " ms; not counting that silence "
                                     "against its peers"});
    membership_.ForgiveSilence(now);
  } else if (interval > 0 && gap > 2 * tick_ms_) {
    // A shorter stall (stopped and resumed within the timeout): the part
    // past the tick is this node's silence too, not its peers'.
    membership_.ExcuseStall(std::chrono::milliseconds(gap - tick_ms_), now);
  }
  const Clock::time_point prev = last_tick_;
  last_tick_ = now;
  std::vector<int> newly_dead, not_back;
  if (interval > 0) {
    // Silent past half the timeout: suspected; past it: dead.
    const auto timeout =
        std::chrono::milliseconds(config_.heartbeat_timeout_ms);
    newly_dead = membership_.Tick(now, timeout / 2, timeout);
  }
  if (IsScheduler()) {
    SchedulerTick(prev, now, &not_back, out);
  } else if (interval > 0) {
    MemberTick(prev, now, &not_back, out);
  }
  // The scheduler judges silence only while it hears a majority of the job.
  if (IsScheduler() && (withholding_ || !newly_dead.empty()) &&
      !JudgesSilence(newly_dead, prev, now, out)) {
    newly_dead.clear();
  }
  if (!IsScheduler() && !newly_dead.empty()) SayIfCutOff(now, out);
  if (!newly_dead.empty()) {
    Declare(newly_dead,
            "no heartbeat for more than " +
                std::to_string(config_.heartbeat_timeout_ms) +
                " ms (PS_HEARTBEAT_TIMEOUT_MS)",
            out);
  }
  if (!not_back.empty()) {
    // Declared dead a second time: now for good.
    Declare(not_back,
            "it did not rejoin within " +
                std::to_string(config_.rejoin_timeout_ms) +
                " ms of its death (PS_REJOIN_TIMEOUT_MS)",
            out);
  }
}

void NodeProtocol::SchedulerTick(Clock::time_point prev, Clock::time_point now,
                                 std::vector<int>* not_back, Output* out) {
  for (int id : membership_.InState(PeerState::kAwaited)) {
    // (A worker whose successor's rejoin started is awaited no more.)
    const Clock::time_point since = membership_.since(id);
    if (MsSince(since, now) > config_.rejoin_timeout_ms) {
      not_back->push_back(id);
    } else if (ReportDue(since, prev, now)) {
      out->lines.push_back(
          {Output::Line::kWarning,
           "the job has waited " + Seconds(MsSince(since, now)) + " for " +
               table_.Describe(id) + " to be restarted (PS_REJOIN_TIMEOUT_MS=" +
               std::to_string(config_.rejoin_timeout_ms) + ")"});
    }
  }
  RejoinTick(now, out);
  TakeoverTick(now, out);
  AnswerBarriers(barriers_.Tick(now), out);
  for (const BarrierCoordinator::Report& r : barriers_.Reports(now)) {
    out->lines.push_back({Output::Line::kWarning, r.line});
  }
}

void NodeProtocol::MemberTick(Clock::time_point prev, Clock::time_point now,
                              std::vector<int>* not_back, Output* out) {
  // While the scheduler is awaited back (restarts), this node reports
  // itself instead of a heartbeat, until a restarted one answers.
  const bool away = membership_.state(kSchedulerId) == PeerState::kAwaited;
  if (MsSince(last_heartbeat_, now) + tick_ms_ / 2 >=
      config_.heartbeat_interval_ms) {
    out->messages.push_back(
        away ? ReportToScheduler()
             : ControlMessage(pb::HEARTBEAT, kSchedulerId, true));
    last_heartbeat_ = now;
  }
  const Clock::time_point gone = membership_.since(kSchedulerId);
  if (away && MsSince(gone, now) > config_.rejoin_timeout_ms) {
    not_back->push_back(kSchedulerId);
  } else if (away && ReportDue(gone, prev, now)) {
    out->lines.push_back(
        {Output::Line::kWarning,
         table_.Describe(self_) + " has waited " + Seconds(MsSince(gone, now)) +
             " for the scheduler at " + config_.SchedulerAddress() +
             " to come back (restarted; PS_REJOIN_TIMEOUT_MS=" +
             std::to_string(config_.rejoin_timeout_ms) + ")"});
  }
}

void NodeProtocol::SayIfCutOff(Clock::time_point now, Output* out) const {
  if (last_peer_ < 0 ||
      MsSince(last_peer_at_, now) > config_.heartbeat_timeout_ms / 2) {
    return;
  }
  out->lines.push_back(
      {Output::Line::kWarning,
       table_.Describe(self_) + " lost the scheduler's heartbeats but heard " +
           table_.Describe(last_peer_) + " " +
           std::to_string(MsSince(last_peer_at_, now)) +
           " ms ago: it is cut off from the scheduler alone, or the "
           "scheduler is down; its word on the scheduler counts only with "
           "a majority of the members' (docs/failures.md)"});
}

bool NodeProtocol::HearsMajority(const std::vector<int>& unheard,
                                 std::string* count,
                                 std::string* silent) const {
  // The voters: the scheduler and each member it watches (live or
  // suspected). Heard: itself, and those neither suspected nor unheard.
  int voters = 1;
  int heard = 1;
  for (const Membership::PeerView& p : membership_.Peers()) {
    if (!p.watched ||
        (p.state != PeerState::kLive && p.state != PeerState::kSuspected)) {
      continue;
    }
    ++voters;
    if (p.state == PeerState::kLive &&
        std::find(unheard.begin(), unheard.end(), p.id) == unheard.end()) {
      ++heard;
      continue;
    }
    *silent += (silent->empty() ? "" : ", ") + table_.Describe(p.id);
  }
  *count = "the scheduler hears " + std::to_string(heard - 1) + " of its " +
           std::to_string(voters - 1) + " members";
  return 2 * heard > voters;
}

bool NodeProtocol::JudgesSilence(const std::vector<int>& silent,
                                 Clock::time_point prev, Clock::time_point now,
                                 Output* out) {
  std::string count;
  std::string unheard;
  if (HearsMajority(silent, &count, &unheard)) {
    if (!withholding_) return true;
    out->lines.push_back({Output::Line::kWarning,
                          count + " again: a majority; it judges silence "
                                  "again, counted from now"});
    withholding_ = false;
    membership_.ForgiveSilence(now);
    return false;
  }
  if (!withholding_ || ReportDue(withheld_since_, prev, now)) {
    if (!withholding_) withheld_since_ = now;
    withholding_ = true;
    out->lines.push_back(
        {Output::Line::kWarning,
         count + " (silent: " + unheard +
             "): more than half of the job at once, so it takes the silence "
             "for its own link's and declares nobody dead until it hears a "
             "majority again"});
  }
  return false;
}

}  // namespace core
}  // namespace ps
