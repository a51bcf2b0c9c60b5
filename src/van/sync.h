// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with
// clang's thread-safety annotations, as leveldb's port::Mutex, so that a
// clang build with -Wthread-safety checks that every GUARDED_BY member is
// read and written under its lock (libstdc++'s own types carry no
// annotations). Other compilers see plain wrappers. Internal.
//
// Thread-safety: a Mutex and a CondVar are used from many threads by design;
// a MutexLock belongs to the thread that made it.
#ifndef PS_SRC_VAN_SYNC_H_
#define PS_SRC_VAN_SYNC_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define PS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PS_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) PS_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY PS_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) PS_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) PS_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) PS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) PS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) PS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) PS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) PS_THREAD_ANNOTATION(assert_capability(x))
#define NO_THREAD_SAFETY_ANALYSIS \
  PS_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace ps {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // Tells the analysis that the caller holds this mutex (e.g. inside a
  // callback that is documented to run under it).
  void AssertHeld() ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope; Unlock()/Lock() release and take it again
// within the scope (e.g. to send a message or run a callback unlocked).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (locked_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    locked_ = false;
    mu_->Unlock();
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    locked_ = true;
  }

 private:
  Mutex* const mu_;
  bool locked_ = true;
};

// A condition variable tied to one Mutex, which every wait must hold.
// Waits are loops in the caller (`while (!ready_) cv_.Wait();`), so the
// analysis sees each guarded read under the lock. The analysis cannot name
// the caller's mutex from here (as with leveldb's port::CondVar), so that
// the waits hold it is the caller's contract, not checked.
class CondVar {
 public:
  using Clock = std::chrono::steady_clock;

  explicit CondVar(Mutex* mu) : mu_(mu) {}
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait() {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // False once `deadline` has passed (the caller checks its condition
  // again either way).
  bool WaitUntil(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    bool in_time = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return in_time;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace ps

#endif  // PS_SRC_VAN_SYNC_H_
