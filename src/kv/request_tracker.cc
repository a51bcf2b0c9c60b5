// RequestTracker: per-request pending-server sets and their waiters.
#include "kv/request_tracker.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

namespace ps {

int RequestTracker::Start(const std::vector<int>& servers, Callback callback) {
  std::vector<Callback> run;
  bool finished = false;
  int ts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ts = next_ts_++;
    Entry& e = entries_[ts];
    e.pending = servers;
    std::sort(e.pending.begin(), e.pending.end());
    e.pending.erase(std::unique(e.pending.begin(), e.pending.end()),
                    e.pending.end());
    e.callback = std::move(callback);
    if (e.pending.empty()) finished = FinishLocked(ts, Status::OK(), &run);
  }
  if (finished) cv_.notify_all();
  for (auto& cb : run) cb();
  return ts;
}

int RequestTracker::StartFailed(const Status& error) {
  std::lock_guard<std::mutex> lock(mu_);
  int ts = next_ts_++;
  Entry& e = entries_[ts];
  e.done = true;
  e.status = error;
  return ts;
}

bool RequestTracker::Answer(int ts, int server, std::string* why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(ts);
  if (it == entries_.end()) {
    *why = "an answer to unknown request " + std::to_string(ts);
    return false;
  }
  Entry& e = it->second;
  if (e.done || e.finishing) {
    return false;  // failed already; ignore
  }
  auto pending = std::find(e.pending.begin(), e.pending.end(), server);
  if (pending == e.pending.end()) {
    *why = "request " + std::to_string(ts) + " does not wait on node id " +
           std::to_string(server);
    return false;
  }
  e.pending.erase(pending);
  if (!e.pending.empty()) return false;
  e.finishing = true;
  return true;
}

void RequestTracker::Finish(int ts, const Status& status) {
  std::vector<Callback> run;
  bool finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished = FinishLocked(ts, status, &run);
  }
  // Notified after the unlock: a waiter woken under the lock would only
  // block again on the mutex.
  if (finished) cv_.notify_all();
  for (auto& cb : run) cb();
}

bool RequestTracker::FinishLocked(int ts, const Status& status,
                                  std::vector<Callback>* run) {
  auto it = entries_.find(ts);
  if (it == entries_.end() || it->second.done) return false;
  Entry& e = it->second;
  e.finishing = false;
  e.status = status;
  if (e.callback) run->push_back(std::move(e.callback));
  e.done = true;
  e.done_flag.store(true, std::memory_order_release);
  return true;
}

void RequestTracker::FailServer(int server, const Status& why) {
  std::vector<Callback> run;
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [ts, e] : entries_) {
      // A request whose last answer is being assembled completes normally.
      if (e.done || e.finishing) continue;
      if (server < 0 || std::find(e.pending.begin(), e.pending.end(), server) !=
                            e.pending.end()) {
        finished |= FinishLocked(ts, why, &run);
      }
    }
  }
  if (finished) cv_.notify_all();
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

Status RequestTracker::Wait(int ts, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(ts);
  if (it == entries_.end()) {
    return Status::InvalidArgument("Wait on unknown timestamp " +
                                   std::to_string(ts));
  }
  if (wait_spin_us_ > 0 && !it->second.done) {
    // Only this Wait erases the entry, so it outlives the unlocked spin.
    lock.unlock();
    SpinUntilDone(it->second);
    lock.lock();
  }
  auto done = [&] { return it->second.done; };
  if (timeout_ms > 0) {
    if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), done)) {
      if (it->second.finishing) {
        cv_.wait(lock, done);  // the last answer is being assembled
      } else {
        std::string pending;
        for (int id : it->second.pending) {
          pending += (pending.empty() ? "" : ", ") + std::to_string(id);
        }
        it->second.done = true;
        it->second.status = Status::Timeout(
            "request " + std::to_string(ts) + " got no answer within " +
            std::to_string(timeout_ms) +
            " ms (PS_REQUEST_TIMEOUT_MS) from node ids " + pending);
      }
    }
  } else {
    cv_.wait(lock, done);
  }
  Status st = std::move(it->second.status);
  entries_.erase(it);
  return st;
}

bool RequestTracker::IsDone(int ts) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(ts);
  return it != entries_.end() && it->second.done;
}

}  // namespace ps
