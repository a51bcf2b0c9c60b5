// Snapshot<T>: a value that many threads read on every message and few
// threads change now and then (a routing table), kept copy-on-write as
// leveldb's db/version_set.cc keeps its versions: a reader takes the
// current value whole, an immutable T held by a std::shared_ptr, and reads
// it without a lock for as long as it holds it; a writer copies the current
// value, changes the copy and installs it whole. A reader sees the value
// before a change or after it, never a mix. Internal.
//
// Cost: Load() is std::atomic_load of a shared_ptr (C++17): a copy of the
// pointer and one reference count increment. No lock of the owner is taken;
// libstdc++ makes the copy atomic with one of a small pool of mutexes of its
// own (chosen by the address), held for those few instructions only.
// Update() copies the whole T: meant for values changed far less often
// than they are read.
//
// Thread-safety: Load() and Update() may be called from any thread; writers
// are serialised by the snapshot's own mutex. A value is destroyed by the
// thread that drops its last reference (a reader, or a writer replacing
// it), so T's destructor must not take a lock held around Load().
#ifndef PS_SRC_VAN_SNAPSHOT_H_
#define PS_SRC_VAN_SNAPSHOT_H_

#include <memory>
#include <type_traits>
#include <utility>

#include "van/sync.h"

namespace ps {

template <typename T>
class Snapshot {
 public:
  explicit Snapshot(T initial = T())
      : current_(std::make_shared<const T>(std::move(initial))) {}
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  // The current value, never null; it stays as it is while held.
  std::shared_ptr<const T> Load() const { return std::atomic_load(&current_); }

  // Installs change(copy of the current value); returns what change
  // returned. `change` runs under the writers' mutex, so changes never lose
  // each other's work; it must not call Update() on this snapshot.
  template <typename Change>
  auto Update(Change&& change) EXCLUDES(writers_mu_) {
    MutexLock lock(&writers_mu_);
    auto next = std::make_shared<T>(*std::atomic_load(&current_));
    if constexpr (std::is_void_v<decltype(change(*next))>) {
      change(*next);
      std::atomic_store(&current_, std::shared_ptr<const T>(std::move(next)));
    } else {
      auto result = change(*next);
      std::atomic_store(&current_, std::shared_ptr<const T>(std::move(next)));
      return result;
    }
  }

 private:
  Mutex writers_mu_;
  // Replaced (std::atomic_store) under writers_mu_ only; read
  // (std::atomic_load) from any thread without it.
  std::shared_ptr<const T> current_;
};

}  // namespace ps

#endif  // PS_SRC_VAN_SNAPSHOT_H_
