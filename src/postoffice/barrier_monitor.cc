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

// ---- Barrier ---------------------------------------------------------------

Status Postoffice::Barrier(int group) {
  NodeProtocol::Output out;
  MutexLock lock(&mu_);
  CHECK(protocol_.ready()) << "Barrier() before a successful Start()";
  CHECK(GroupContains(group, my_id_))
      << DescribeId(my_id_) << " is not in barrier group " << GroupName(group);
  const BarrierWaits::Ticket ticket =
      protocol_.EnterBarrier(group, Clock::now(), &out);
  AfterStepLocked(&out);
  lock.Unlock();
  Flush(&out);
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
        return protocol_.barrier_waits().Released(ticket) ||
               protocol_.SchedulerGone();
      },
      [&](int64_t waited) {
        mu_.AssertHeld();
        return protocol_.BarrierWaitLine(group, waited);
      });
  BarrierWaits& waits = protocol_.barrier_waits();
  waits.Leave(ticket);
  if (waits.Released(ticket)) return waits.StatusOf(ticket);
  if (!protocol_.SchedulerGone()) {
    return Status::Timeout("barrier of " + GroupName(group) +
                           " got no answer from the scheduler at " +
                           config_.SchedulerAddress() + " within " +
                           std::to_string(wait_ms) + " ms");
  }
  return protocol_.peer_failure();
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
    return protocol_.Staying();
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

// ---- Monitor thread and failures -------------------------------------------

void Postoffice::MonitorLoop() {
  MutexLock lock(&mu_);
  const int tick = protocol_.tick_ms();
  protocol_.Start(Clock::now());
  while (!stop_monitor_) {
    if (tick == 0) {
      while (!stop_monitor_) cv_.Wait();
      break;
    }
    auto tick_end = Clock::now() + std::chrono::milliseconds(tick);
    while (!stop_monitor_ && cv_.WaitUntil(tick_end)) {
    }
    if (stop_monitor_) break;
    const Clock::time_point now = Clock::now();
    NodeProtocol::Output out;
    protocol_.Tick(now, &out);
    TakeHeldRestartsLocked(&out);
    AfterStepLocked(&out);
    lock.Unlock();
    Flush(&out);
    ExpireHeldRequests(now);
    TickCustomers(now);
    lock.Lock();
  }
}

}  // namespace ps
