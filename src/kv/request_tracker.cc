// RequestTracker: per-request pending-server sets and their waiters.
#include "kv/request_tracker.h"

#include <chrono>

namespace ps {

int RequestTracker::Start(const std::vector<int>& servers, Callback callback) {
  std::vector<Callback> run;
  int ts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ts = next_ts_++;
    Entry& e = entries_[ts];
    e.pending.insert(servers.begin(), servers.end());
    e.callback = std::move(callback);
    if (e.pending.empty()) FinishLocked(ts, Status::OK(), &run);
  }
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
  if (e.done || e.finishing) return false;  // failed already; ignore
  if (e.pending.erase(server) == 0) {
    *why = "request " + std::to_string(ts) + " does not wait on node id " +
           std::to_string(server);
    return false;
  }
  if (!e.pending.empty()) return false;
  e.finishing = true;
  return true;
}

void RequestTracker::Finish(int ts, const Status& status) {
  std::vector<Callback> run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(ts, status, &run);
  }
  for (auto& cb : run) cb();
}

void RequestTracker::FinishLocked(int ts, const Status& status,
                                  std::vector<Callback>* run) {
  auto it = entries_.find(ts);
  if (it == entries_.end() || it->second.done) return;
  Entry& e = it->second;
  e.done = true;
  e.finishing = false;
  e.status = status;
  if (e.callback) run->push_back(std::move(e.callback));
  cv_.notify_all();
}

void RequestTracker::FailServer(int server, const Status& why) {
  std::vector<Callback> run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [ts, e] : entries_) {
      // A request whose last answer is being assembled completes normally.
      if (e.done || e.finishing) continue;
      if (server < 0 || e.pending.count(server) > 0) {
        FinishLocked(ts, why, &run);
      }
    }
  }
  for (auto& cb : run) cb();
}

Status RequestTracker::Wait(int ts, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(ts);
  if (it == entries_.end()) {
    return Status::InvalidArgument("Wait on unknown timestamp " +
                                   std::to_string(ts));
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
  Status st = it->second.status;
  entries_.erase(it);
  return st;
}

bool RequestTracker::IsDone(int ts) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(ts);
  return it != entries_.end() && it->second.done;
}

}  // namespace ps
