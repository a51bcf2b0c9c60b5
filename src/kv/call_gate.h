// CallGate: lets callbacks that the postoffice may run on any thread (peer
// failures) into an object only while it lives. The callback holds the gate
// by shared_ptr; the object's destructor closes it, which waits out the
// calls inside (except its own thread's: an object destroyed from inside
// one of its callbacks) and turns later ones away.
//
// Thread-safety: every method may be called from any thread.
#ifndef PS_SRC_KV_CALL_GATE_H_
#define PS_SRC_KV_CALL_GATE_H_

#include <algorithm>
#include <thread>
#include <vector>

#include "van/sync.h"

namespace ps {

class CallGate {
 public:
  // Runs fn() unless the gate is closed; true if it ran.
  template <typename Fn>
  bool Call(Fn&& fn) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (closed_) return false;
      inside_.push_back(std::this_thread::get_id());
    }
    fn();
    {
      MutexLock lock(&mu_);
      inside_.erase(std::find(inside_.begin(), inside_.end(),
                              std::this_thread::get_id()));
    }
    cv_.SignalAll();
    return true;
  }

  // Turns later calls away and waits for those of other threads inside.
  void Close() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    closed_ = true;
    while (!OnlySelfInsideLocked()) cv_.Wait();
  }

 private:
  // Whether every call inside is this thread's own.
  bool OnlySelfInsideLocked() const REQUIRES(mu_) {
    const auto self = std::this_thread::get_id();
    return std::all_of(inside_.begin(), inside_.end(),
                       [&](std::thread::id t) { return t == self; });
  }

  Mutex mu_;
  CondVar cv_{&mu_};
  bool closed_ GUARDED_BY(mu_) = false;
  std::vector<std::thread::id> inside_ GUARDED_BY(mu_);  // one per running call
};

}  // namespace ps

#endif  // PS_SRC_KV_CALL_GATE_H_
