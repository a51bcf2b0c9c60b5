// Postoffice, continued: barriers (member and scheduler side), the control
// waits that report themselves (WaitReportingLocked; the scheduler's last
// wait, for the goodbyes), the monitor thread (heartbeats, liveness,
// barrier deadlines and reports) and peer failures.
#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "postoffice/logging.h"
#include "postoffice/postoffice.h"

namespace ps {

namespace {
constexpr int kSchedulerTickMs = 100;

int64_t MsSince(Postoffice::Clock::time_point t,
                Postoffice::Clock::time_point now) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count();
}
}  // namespace

// ---- Barrier ---------------------------------------------------------------

Status Postoffice::Barrier(int group) {
  std::vector<Message> outbox;
  MutexLock lock(&mu_);
  CHECK(ready_) << "Barrier() before a successful Start()";
  CHECK(GroupContains(group, my_id_))
      << DescribeId(my_id_) << " is not in barrier group " << GroupName(group);
  const BarrierWaits::Ticket ticket = barrier_waits_.Enter(group);
  if (IsScheduler()) {
    outbox =
        AnswerBarriersLocked(barriers_.Arrive(group, my_id_, Clock::now()));
  } else {
    // Sent when the scheduler comes back if it is awaited (restarts).
    if (membership_.state(kSchedulerId) != PeerState::kAwaited) {
      Message msg = ControlMessage(pb::BARRIER, kSchedulerId, true);
      msg.meta.mutable_control()->set_barrier_group(group);
      outbox.push_back(std::move(msg));
    }
  }
  lock.Unlock();
  SendAll(&outbox);
  lock.Lock();
  // The scheduler enforces barrier_timeout_ms and names who is missing
  // (each report interval, and at the timeout); the extra connect timeout
  // covers its answer travelling back. In 64 bits: both may be INT_MAX.
  const int64_t wait_ms =
      int64_t{config_.barrier_timeout_ms} + config_.connect_timeout_ms;
  auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
  // A scheduler awaited back (restarts) is waited for, within the deadline.
  WaitReportingLocked(
      deadline,
      [&] {
        mu_.AssertHeld();  // called by WaitReportingLocked, under mu_
        return barrier_waits_.Released(ticket) || SchedulerGoneLocked();
      },
      [&](int64_t waited) {
        mu_.AssertHeld();
        return BarrierWaitLineLocked(group, waited);
      });
  barrier_waits_.Leave(ticket);
  if (barrier_waits_.Released(ticket)) return barrier_waits_.StatusOf(ticket);
  if (!SchedulerGoneLocked()) {
    return Status::Timeout("barrier of " + GroupName(group) +
                           " got no answer from the scheduler at " +
                           config_.SchedulerAddress() + " within " +
                           std::to_string(wait_ms) + " ms");
  }
  return peer_failure_;
}

std::string Postoffice::BarrierWaitLineLocked(int group, int64_t waited) const {
  // The scheduler's coordinator names who has not arrived.
  if (IsScheduler()) return "";
  const std::string line = "barrier of " + GroupName(group) + ": " +
                           table_.Describe(my_id_) + " has waited " +
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

bool Postoffice::WaitReportingLocked(
    Clock::time_point deadline, const std::function<bool()>& done,
    const std::function<std::string(int64_t)>& report) {
  const Clock::time_point start = Clock::now();
  const auto every = std::chrono::milliseconds(ReportEveryMs());
  Clock::time_point next = start + every;
  // Bounded by the deadline: each round waits until it or the next report.
  while (!done()) {
    const Clock::time_point until = std::min(deadline, next);
    if (cv_.WaitUntil(until)) continue;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) break;
    if (now < next) continue;
    const std::string line = report(MsSince(start, now));
    if (!line.empty()) LOG(WARNING) << line;
    next += every;
  }
  return done();
}

void Postoffice::AwaitGoodbyes() {
  MutexLock lock(&mu_);
  auto deadline =
      Clock::now() + std::chrono::milliseconds(config_.connect_timeout_ms);
  const auto staying = [&] {
    mu_.AssertHeld();  // called by WaitReportingLocked too, under mu_
    std::string who;
    for (const auto& [id, node] : table_.nodes()) {
      const PeerState state = membership_.state(id);
      if (id == my_id_ || state == PeerState::kDeparted ||
          state == PeerState::kDead || state == PeerState::kAwaited ||
          state == PeerState::kCovered) {
        continue;
      }
      who += (who.empty() ? "" : ", ") + table_.Describe(id);
    }
    return who;
  };
  const bool all_left = WaitReportingLocked(
      deadline,
      [&] {
        mu_.AssertHeld();
        return staying().empty();
      },
      [&](int64_t waited) {
        mu_.AssertHeld();
        return "the scheduler has waited " + Seconds(waited) +
               " for the goodbyes of " + staying();
      });
  if (!all_left) {
    LOG(WARNING) << "the scheduler stops without the goodbyes of " << staying()
                 << " (PS_CONNECT_TIMEOUT_MS=" << config_.connect_timeout_ms
                 << ")";
  }
}

bool Postoffice::ReportDue(Clock::time_point since, Clock::time_point prev,
                           Clock::time_point now) const {
  const int64_t every = ReportEveryMs();
  return MsSince(since, now) / every >
         std::max<int64_t>(0, MsSince(since, prev)) / every;
}

void Postoffice::OnBarrier(const Message& msg) {
  int group = msg.meta.control().barrier_group();
  std::vector<Message> outbox;
  {
    MutexLock lock(&mu_);
    if (IsScheduler() && msg.meta.request()) {
      if (!GroupContains(group, msg.meta.sender()) || group <= 0 ||
          group > kAllGroups) {
        van_.CountDropped(
            table_.Describe(msg.meta.sender()),
            "barrier for group " + std::to_string(group) + " it is not in");
        return;
      }
      outbox = AnswerBarriersLocked(
          barriers_.Arrive(group, msg.meta.sender(), Clock::now()));
    } else if (!IsScheduler() && !msg.meta.request()) {
      const pb::Control& c = msg.meta.control();
      SignalOwnBarrierLocked(
          group,
          c.error().empty()
              ? Status::OK()
              : Status(static_cast<Status::Code>(c.error_code()), c.error()));
    }
  }
  SendAll(&outbox);
}

void Postoffice::SignalOwnBarrierLocked(int group, const Status& error) {
  barrier_waits_.Release(group, error);
  cv_.SignalAll();
}

bool Postoffice::TakenOver(int id) const {
  return membership_.state(id) == PeerState::kCovered;
}

std::vector<Message> Postoffice::AnswerBarriersLocked(
    const std::vector<BarrierCoordinator::Release>& releases) {
  std::vector<Message> outbox;
  for (const BarrierCoordinator::Release& r : releases) {
    for (int id : r.arrived) {
      if (id == my_id_) {
        SignalOwnBarrierLocked(r.group, r.status);
        continue;
      }
      Message msg = ControlMessage(pb::BARRIER, id, false);
      msg.meta.mutable_control()->set_barrier_group(r.group);
      msg.meta.mutable_control()->set_error(r.status.message());
      msg.meta.mutable_control()->set_error_code(r.status.code());
      outbox.push_back(std::move(msg));
    }
    if (!r.status.ok()) LOG(ERROR) << r.status;
  }
  return outbox;
}

// ---- Monitor thread and failures -------------------------------------------

void Postoffice::MonitorLoop() {
  int interval = config_.heartbeat_interval_ms;
  int tick = IsScheduler() ? kSchedulerTickMs : (interval > 0 ? interval : 0);
  // Resends are due at PS_RESEND_TIMEOUT_MS granularity: tick at least
  // twice as often (heartbeats still go once per interval).
  if (config_.resend_timeout_ms > 0) {
    int resend_tick = std::max(1, config_.resend_timeout_ms / 2);
    tick = tick == 0 ? resend_tick : std::min(tick, resend_tick);
  }
  MutexLock lock(&mu_);
  Clock::time_point last_tick = Clock::now();
  Clock::time_point last_heartbeat = last_tick;
  if (!IsScheduler()) membership_.Watch(kSchedulerId, last_tick);
  while (!stop_monitor_) {
    if (tick == 0) {
      while (!stop_monitor_) cv_.Wait();
      break;
    }
    auto tick_end = Clock::now() + std::chrono::milliseconds(tick);
    while (!stop_monitor_ && cv_.WaitUntil(tick_end)) {
    }
    if (stop_monitor_) break;
    auto now = Clock::now();
    const int64_t gap = MsSince(last_tick, now);
    if (interval > 0 && gap > config_.heartbeat_timeout_ms) {
      // This node itself was stopped (SIGSTOP, a debugger) or starved of
      // CPU: the silence it sees is its own, so it blames nobody for it.
      LOG(WARNING) << table_.Describe(my_id_) << " was stalled for " << gap
                   << " ms; not counting that silence against its peers";
      membership_.ForgiveSilence(now);
    } else if (interval > 0 && gap > 2 * tick) {
      // A shorter stall (stopped and resumed within the timeout): the part
      // past the tick is this node's silence too, not its peers'.
      membership_.ExcuseStall(std::chrono::milliseconds(gap - tick), now);
    }
    const Clock::time_point prev_tick = last_tick;
    last_tick = now;
    std::vector<Message> outbox;
    std::vector<PeerEvent> events;
    std::vector<int> newly_dead, not_back;
    if (interval > 0) {
      // Silent past half the timeout: suspected; past it: dead.
      const auto timeout =
          std::chrono::milliseconds(config_.heartbeat_timeout_ms);
      newly_dead = membership_.Tick(now, timeout / 2, timeout);
    }
    if (IsScheduler()) {
      outbox = SchedulerCheckLocked(prev_tick, now, &not_back, &events);
    } else if (interval > 0) {
      // While the scheduler is awaited back (restarts), this node reports
      // itself instead of a heartbeat, until a restarted one answers.
      const bool away = membership_.state(kSchedulerId) == PeerState::kAwaited;
      if (MsSince(last_heartbeat, now) + tick / 2 >= interval) {
        outbox.push_back(
            away ? ReportToSchedulerLocked()
                 : ControlMessage(pb::HEARTBEAT, kSchedulerId, true));
        last_heartbeat = now;
      }
      const Clock::time_point gone = membership_.since(kSchedulerId);
      if (away && MsSince(gone, now) > config_.rejoin_timeout_ms) {
        not_back.push_back(kSchedulerId);
      } else if (away && ReportDue(gone, prev_tick, now)) {
        LOG(WARNING) << table_.Describe(my_id_) << " has waited "
                     << Seconds(MsSince(gone, now)) << " for the scheduler at "
                     << config_.SchedulerAddress()
                     << " to come back (restarted; PS_REJOIN_TIMEOUT_MS="
                     << config_.rejoin_timeout_ms << ")";
      }
    }
    lock.Unlock();
    SendAll(&outbox);
    membership_.Publish(events);
    if (!newly_dead.empty()) {
      DeclareDead(newly_dead, "no heartbeat for more than " +
                                  std::to_string(config_.heartbeat_timeout_ms) +
                                  " ms (PS_HEARTBEAT_TIMEOUT_MS)");
    }
    if (!not_back.empty()) {
      // Declared dead a second time: now for good.
      DeclareDead(not_back, "it did not rejoin within " +
                                std::to_string(config_.rejoin_timeout_ms) +
                                " ms of its death (PS_REJOIN_TIMEOUT_MS)");
    }
    ExpireHeldRequests(now);
    TickCustomers(now);
    lock.Lock();
  }
}

std::vector<Message> Postoffice::SchedulerCheckLocked(
    Clock::time_point prev, Clock::time_point now, std::vector<int>* not_back,
    std::vector<PeerEvent>* events) {
  std::vector<Message> outbox;
  for (int id : membership_.InState(PeerState::kAwaited)) {
    // (A worker whose successor's rejoin started is awaited no more.)
    const Clock::time_point since = membership_.since(id);
    if (MsSince(since, now) > config_.rejoin_timeout_ms) {
      not_back->push_back(id);
    } else if (ReportDue(since, prev, now)) {
      LOG(WARNING) << "the job has waited " << Seconds(MsSince(since, now))
                   << " for " << table_.Describe(id)
                   << " to be restarted (PS_REJOIN_TIMEOUT_MS="
                   << config_.rejoin_timeout_ms << ")";
    }
  }
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
    LOG(WARNING) << "the rejoin of " << table_.Describe(o.id)
                 << " goes ahead without an answer from" << silent;
    FinishRejoinLocked(o.id, &outbox, events);
  }
  for (const RejoinCoordinator::Refused& r : refused) {
    Status st = Status::InvalidArgument(
        "the worker at " + r.node.Address() + " registered as a restart of " +
        table_.Describe(r.id) + ", which is still alive after " +
        std::to_string(wait_ms) + " ms: refused");
    LOG(WARNING) << st.message();
    Message reject = ControlMessage(pb::ADD_NODE, r.temp_id, false);
    reject.meta.mutable_control()->set_error(st.message());
    reject.meta.mutable_control()->set_error_code(st.code());
    outbox.push_back(std::move(reject));
  }
  for (Message& m : AnswerBarriersLocked(barriers_.Tick(now))) {
    outbox.push_back(std::move(m));
  }
  for (const BarrierCoordinator::Report& r : barriers_.Reports(now)) {
    LOG(WARNING) << r.line;
  }
  return outbox;
}

}  // namespace ps
