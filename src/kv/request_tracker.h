// RequestTracker: which servers a worker's request still waits on. A request
// is done when every server it touched (and only those) has answered, or
// when it failed (a dead server, a malformed answer, a stop).
//
// Thread-safety: every method may be called from any thread; one thread at
// a time may Wait on a given timestamp (which is what lets Wait spin on its
// entry without the lock: only Wait erases an entry). Nothing runs under the
// lock: the condition variable is notified and callbacks run after it is
// released (a waiter woken under the lock would only block again on the mutex).
#ifndef PS_SRC_KV_REQUEST_TRACKER_H_
#define PS_SRC_KV_REQUEST_TRACKER_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ps/status.h"

namespace ps {

class RequestTracker {
 public:
  using Callback = std::function<void()>;

  // Wait spins (yielding) up to `wait_spin_us` microseconds for a request to
  // finish before it blocks on the condition variable: an answer that comes
  // that soon then costs no thread wake-up. 0: block at once.
  explicit RequestTracker(int wait_spin_us = 0) : wait_spin_us_(wait_spin_us) {}

  // A new request waiting on `servers` (node ids); returns its timestamp.
  // With no servers it is done at once (the callback runs here).
  int Start(const std::vector<int>& servers, Callback callback);
  // A request that failed before it was sent (bad input).
  int StartFailed(const Status& error);

  // Records that `server` answered `ts`. Returns true when that was the last
  // answer: the caller then finishes its work and calls Finish(ts, status).
  // An answer for an unknown or done request, or from a server the request
  // does not wait on, returns false and sets *why (unless it was failed
  // already, when *why stays empty).
  bool Answer(int ts, int server, std::string* why);
  // Marks ts done with `status`, wakes waiters, runs its callback.
  void Finish(int ts, const Status& status);
  // Fails every pending request waiting on `server` (-1: every request).
  void FailServer(int server, const Status& why);

  // Blocks until ts is done or `timeout_ms` passed (0: no limit); returns
  // its status and forgets it. An unknown ts is an InvalidArgument.
  Status Wait(int ts, int timeout_ms);
  // Whether ts is done (without forgetting it).
  bool IsDone(int ts) const;

 private:
  struct Entry {
    std::vector<int> pending;  // server ids not yet answered (a few)
    bool done = false;
    std::atomic<bool> done_flag{false};  // == done, read without mu_ by Wait
    bool finishing = false;  // the last answer came; Finish() follows
    Status status;
    Callback callback;
  };
  // Marks ts done; queues its callback on *run. False when it was unknown
  // or done already. The caller notifies cv_ after releasing mu_.
  bool FinishLocked(int ts, const Status& status, std::vector<Callback>* run);

  // Yields until the entry is done or wait_spin_us_ passed; true if done.
  bool SpinUntilDone(const Entry& e) const;

  const int wait_spin_us_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int next_ts_ = 0;
  std::map<int, Entry> entries_;
};

}  // namespace ps

#endif  // PS_SRC_KV_REQUEST_TRACKER_H_
