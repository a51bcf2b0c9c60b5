// RequestTracker: per-request pending-server sets and their waiters.
#include "kv/request_tracker.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <thread>

namespace ps {

int RequestTracker::NextTimestampLocked() {
  // Timestamps are int32 on the wire: wrap to 0 after INT_MAX, skipping
  // those still in use (there are never 2^31 of them).
  for (;;) {
    int ts = next_ts_;
    next_ts_ = next_ts_ == INT_MAX ? 0 : next_ts_ + 1;
    if (entries_.count(ts) > 0) continue;
    recent_.erase(std::remove_if(recent_.begin(), recent_.end(),
                                 [ts](const auto& r) { return r.first == ts; }),
                  recent_.end());
    return ts;
  }
}

void RequestTracker::set_next_timestamp_for_test(int ts) {
  MutexLock lock(&mu_);
  next_ts_ = ts;
}

int RequestTracker::Start(const std::vector<int>& servers, Callback callback,
                          bool forget_when_done,
                          std::shared_ptr<void> payload) {
  std::vector<Callback> run;
  bool finished = false;
  int ts;
  {
    MutexLock lock(&mu_);
    ts = NextTimestampLocked();
    auto e = std::make_shared<Entry>();
    entries_[ts] = e;
    e->pending = servers;
    std::sort(e->pending.begin(), e->pending.end());
    e->pending.erase(std::unique(e->pending.begin(), e->pending.end()),
                     e->pending.end());
    e->callback = std::move(callback);
    e->forget_when_done = forget_when_done;
    e->payload = std::move(payload);
    if (e->pending.empty()) {
      std::vector<int> forget;
      finished = FinishLocked(ts, Status::OK(), &run, &forget);
      ForgetLocked(forget);
    }
  }
  if (finished) cv_.SignalAll();
  for (auto& cb : run) cb();
  return ts;
}

int RequestTracker::StartFailed(const Status& error) {
  MutexLock lock(&mu_);
  int ts = NextTimestampLocked();
  auto e = std::make_shared<Entry>();
  e->done = true;
  e->done_flag.store(true);
  e->status = error;
  entries_[ts] = e;
  return ts;
}

bool RequestTracker::Answer(int ts, int server, std::string* why,
                            const Status& error) {
  MutexLock lock(&mu_);
  auto it = entries_.find(ts);
  if (it == entries_.end()) {
    *why = "an answer to unknown request " + std::to_string(ts);
    return false;
  }
  Entry& e = *it->second;
  if (e.done || e.finishing) {
    return false;  // failed already; ignore
  }
  auto pending = std::find(e.pending.begin(), e.pending.end(), server);
  if (pending == e.pending.end()) {
    *why = "request " + std::to_string(ts) + " does not wait on node id " +
           std::to_string(server);
    return false;
  }
  if (!error.ok() && e.error.ok()) e.error = error;
  e.pending.erase(pending);
  if (!e.pending.empty()) return false;
  e.finishing = true;
  return true;
}

void RequestTracker::Finish(int ts, const Status& status) {
  std::vector<Callback> run;
  bool finished;
  {
    MutexLock lock(&mu_);
    std::vector<int> forget;
    finished = FinishLocked(ts, status, &run, &forget);
    ForgetLocked(forget);
  }
  // Notified after the unlock: a waiter woken under the lock would only
  // block again on the mutex.
  if (finished) cv_.SignalAll();
  for (auto& cb : run) cb();
}

bool RequestTracker::FinishLocked(int ts, const Status& status,
                                  std::vector<Callback>* run,
                                  std::vector<int>* forget) {
  auto it = entries_.find(ts);
  if (it == entries_.end() || it->second->done) return false;
  Entry& e = *it->second;
  e.finishing = false;
  e.status = e.error.ok() ? status : e.error;
  if (e.callback) run->push_back(std::move(e.callback));
  e.done = true;
  e.done_flag.store(true, std::memory_order_release);
  if (e.forget_when_done && e.waiters == 0) forget->push_back(ts);
  return true;
}

void RequestTracker::ForgetLocked(const std::vector<int>& forget) {
  for (int ts : forget) {
    auto it = entries_.find(ts);
    if (it == entries_.end()) continue;
    recent_.emplace_back(ts, it->second->status);
    entries_.erase(it);
    if (recent_.size() > kRecentKept) recent_.pop_front();
  }
}

void RequestTracker::FailServer(int server, const Status& why) {
  std::vector<Callback> run;
  bool finished = false;
  {
    MutexLock lock(&mu_);
    std::vector<int> forget;
    for (auto& [ts, e] : entries_) {
      // A request whose last answer is being assembled completes normally.
      if (e->done || e->finishing) continue;
      if (server < 0 || std::find(e->pending.begin(), e->pending.end(),
                                  server) != e->pending.end()) {
        finished |= FinishLocked(ts, why, &run, &forget);
      }
    }
    ForgetLocked(forget);
  }
  if (finished) cv_.SignalAll();
  for (auto& cb : run) cb();
}

bool RequestTracker::SpinUntilDone(const Entry& e) const {
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::microseconds(wait_spin_us_);
  while (!e.done_flag.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::yield();  // lets the receive thread run on few cores
  }
  return true;
}

std::string RequestTracker::NameLocked(int id) const {
  return describe_ ? describe_(id) : "node id " + std::to_string(id);
}

Status RequestTracker::Wait(int ts, int timeout_ms) {
  MutexLock lock(&mu_);
  auto it = entries_.find(ts);
  if (it == entries_.end()) {
    for (auto r = recent_.begin(); r != recent_.end(); ++r) {
      if (r->first != ts) continue;
      Status st = std::move(r->second);
      recent_.erase(r);
      return st;
    }
    return Status::InvalidArgument("Wait on unknown timestamp " +
                                   std::to_string(ts) +
                                   " (or one another Wait returned)");
  }
  // Our own reference: another Wait on ts may forget the entry first.
  EntryPtr e = it->second;
  ++e->waiters;
  if (wait_spin_us_ > 0 && !e->done) {
    lock.Unlock();
    SpinUntilDone(*e);
    lock.Lock();
  }
  if (timeout_ms > 0) {
    auto deadline =
        CondVar::Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!e->done && cv_.WaitUntil(deadline)) {
    }
    if (!e->done) {
      if (e->finishing) {
        while (!e->done) cv_.Wait();  // the last answer is being assembled
      } else {
        std::string pending;
        for (int id : e->pending) {
          pending += (pending.empty() ? "" : ", ") + NameLocked(id);
        }
        e->done = true;
        e->done_flag.store(true, std::memory_order_release);
        e->status = Status::Timeout(
            "request " + std::to_string(ts) + " got no answer within " +
            std::to_string(timeout_ms) + " ms (PS_REQUEST_TIMEOUT_MS) from " +
            pending);
        lock.Unlock();
        cv_.SignalAll();  // other Waits on ts
        lock.Lock();
      }
    }
  } else {
    while (!e->done) cv_.Wait();
  }
  --e->waiters;
  Status st = e->status;
  it = entries_.find(ts);
  if (it != entries_.end() && it->second == e) entries_.erase(it);
  return st;
}

bool RequestTracker::IsDone(int ts) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(ts);
  if (it != entries_.end()) return it->second->done;
  return std::any_of(recent_.begin(), recent_.end(),
                     [ts](const auto& r) { return r.first == ts; });
}

bool RequestTracker::Awaits(int ts, int server) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(ts);
  if (it == entries_.end() || it->second->done) return false;
  const std::vector<int>& pending = it->second->pending;
  return std::find(pending.begin(), pending.end(), server) != pending.end();
}

std::shared_ptr<void> RequestTracker::Payload(int ts) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(ts);
  return it == entries_.end() ? nullptr : it->second->payload;
}

size_t RequestTracker::num_pending() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace ps
