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
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace ps {

class CallGate {
 public:
  // Runs fn() unless the gate is closed; true if it ran.
  template <typename Fn>
  bool Call(Fn&& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      inside_.push_back(std::this_thread::get_id());
    }
    fn();
    {
      std::lock_guard<std::mutex> lock(mu_);
      inside_.erase(std::find(inside_.begin(), inside_.end(),
                              std::this_thread::get_id()));
    }
    cv_.notify_all();
    return true;
  }

  // Turns later calls away and waits for those of other threads inside.
  void Close() {
    std::unique_lock<std::mutex> lock(mu_);
    closed_ = true;
    const auto self = std::this_thread::get_id();
    cv_.wait(lock, [&] {
      return std::all_of(inside_.begin(), inside_.end(),
                         [&](std::thread::id t) { return t == self; });
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::vector<std::thread::id> inside_;  // one per running call
};

}  // namespace ps

#endif  // PS_SRC_KV_CALL_GATE_H_
