// RequestTracker: which servers a worker's request still waits on. A request
// is done when every server it touched (and only those) has answered, or
// when it failed (a dead server, an error answer, a malformed answer, a
// stop).
//
// Lifetime of an entry: a request without a callback is kept until Wait
// returns its status. A request with a callback needs no Wait: once done (and
// its callback queued) it is forgotten unless a Wait is blocked on it; its
// status stays Wait-able among the last kRecentKept such requests. Each entry
// may carry a payload (the worker's pull state), freed with it.
//
// Thread-safety: every method may be called from any thread, several Waits
// on one timestamp included (each gets the status; a Wait that starts after
// the status was handed out and forgotten gets InvalidArgument). Entries are
// shared_ptrs, so a Wait spinning without the lock keeps its entry alive.
// Nothing runs under the lock except the naming function of a timeout: the
// condition variable is notified and callbacks run after it is released.
#ifndef PS_SRC_KV_REQUEST_TRACKER_H_
#define PS_SRC_KV_REQUEST_TRACKER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ps/status.h"
#include "van/sync.h"

namespace ps {

class RequestTracker {
 public:
  using Callback = std::function<void()>;
  // Names node `id` in messages ("server 0 (tcp://...)").
  using Describe = std::function<std::string(int id)>;
  // How many forgotten callback requests keep their status for a late Wait.
  static constexpr size_t kRecentKept = 256;

  // Wait spins (yielding) up to `wait_spin_us` microseconds for a request to
  // finish before it blocks on the condition variable: an answer that comes
  // that soon then costs no thread wake-up. 0: block at once. `describe`
  // names servers in a timeout (null: "node id N").
  explicit RequestTracker(int wait_spin_us = 0, Describe describe = nullptr)
      : wait_spin_us_(wait_spin_us), describe_(std::move(describe)) {}

  // A new request waiting on `servers` (node ids); returns its timestamp, in
  // [0, INT_MAX] (wraps, skipping timestamps in use). With no servers it is
  // done at once (the callback runs here). `forget_when_done`: the caller
  // may never Wait (see above). `payload` lives as long as the entry.
  int Start(const std::vector<int>& servers, Callback callback,
            bool forget_when_done = false,
            std::shared_ptr<void> payload = nullptr);
  // A request that failed before it was sent (bad input).
  int StartFailed(const Status& error);

  // Records that `server` answered `ts`. Returns true when that was the last
  // answer: the caller then finishes its work and calls Finish(ts, status).
  // An answer for an unknown or done request, or from a server the request
  // does not wait on, returns false and sets *why (unless it was failed
  // already, when *why stays empty).
  // A non-OK `error` (the server refused the request) becomes the request's
  // status, whatever Finish is told.
  bool Answer(int ts, int server, std::string* why,
              const Status& error = Status::OK());
  // Marks ts done with `status`, wakes waiters, runs its callback.
  void Finish(int ts, const Status& status);
  // Fails every pending request waiting on `server` (-1: every request).
  void FailServer(int server, const Status& why);

  // Blocks until ts is done or `timeout_ms` passed (0: no limit); returns
  // its status and forgets it. An unknown ts is an InvalidArgument.
  Status Wait(int ts, int timeout_ms);
  // Whether ts is done (without forgetting it).
  bool IsDone(int ts) const;
  // Whether ts is pending and still waits on `server`'s answer.
  bool Awaits(int ts, int server) const;
  // ts's payload (null when unknown or none).
  std::shared_ptr<void> Payload(int ts) const;

  // Entries not yet forgotten (tests: nothing leaks).
  size_t num_pending() const;
  // Tests: the next timestamp Start hands out (e.g. near INT_MAX).
  void set_next_timestamp_for_test(int ts);

 private:
  // Guarded by mu_ (which the analysis cannot name from here), but for
  // done_flag.
  struct Entry {
    std::vector<int> pending;  // server ids not yet answered (a few)
    bool done = false;
    std::atomic<bool> done_flag{false};  // == done, read without mu_ by Wait
    bool finishing = false;  // the last answer came; Finish() follows
    bool forget_when_done = false;
    int waiters = 0;  // Waits blocked on it
    Status error;     // an error answer; wins over Finish's status
    Status status;
    Callback callback;
    std::shared_ptr<void> payload;
  };
  using EntryPtr = std::shared_ptr<Entry>;
  // Marks ts done; queues its callback on *run and, when it is to be
  // forgotten, its timestamp on *forget. False when it was unknown or done
  // already. The caller notifies cv_ after releasing mu_.
  bool FinishLocked(int ts, const Status& status, std::vector<Callback>* run,
                    std::vector<int>* forget) REQUIRES(mu_);
  // Forgets done callback entries nobody waits on, keeping their status.
  void ForgetLocked(const std::vector<int>& forget) REQUIRES(mu_);
  int NextTimestampLocked() REQUIRES(mu_);
  std::string NameLocked(int id) const REQUIRES(mu_);

  // Yields until the entry is done or wait_spin_us_ passed; true if done.
  bool SpinUntilDone(const Entry& e) const;

  const int wait_spin_us_;
  const Describe describe_;
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  int next_ts_ GUARDED_BY(mu_) = 0;  // in [0, INT_MAX]
  std::map<int, EntryPtr> entries_ GUARDED_BY(mu_);
  // Forgotten, oldest first.
  std::deque<std::pair<int, Status>> recent_ GUARDED_BY(mu_);
};

}  // namespace ps

#endif  // PS_SRC_KV_REQUEST_TRACKER_H_
