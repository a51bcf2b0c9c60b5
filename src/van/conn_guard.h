// ConnGuard: the bookkeeping that keeps idle connections from strangers off
// a node's descriptors. Anyone who reaches a node's port can open TCP
// connections to it, and each costs the process a descriptor until its
// handshake deadline (VanOptions::handshake_timeout_ms); a flood of them
// would starve the process's own opens (a checkpoint file, a connection to
// a peer). The van's auth thread tells the guard of each connection its
// ROUTER accepted (the descriptor, the source address, a name) and of each
// that closed; the guard answers which connections to shut down so that at
// most `per_source` of them from one address and `total` in all are held,
// the oldest first. A connection is only shut if `still_idle` (the
// caller's check, e.g. that it sent nothing past a ZMTP greeting) says so
// when it comes to be chosen; one that is not (a member's, whose handshake
// went on) is forgotten instead, never shut.
//
// Pure bookkeeping: no socket calls, no clock of its own (the caller passes
// the time), so it is tested without sockets. Not thread-safe: one owner
// (the auth thread).
#ifndef PS_SRC_VAN_CONN_GUARD_H_
#define PS_SRC_VAN_CONN_GUARD_H_

#include <sys/resource.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace ps {

class ConnGuard {
 public:
  using Clock = std::chrono::steady_clock;

  // A connection chosen to be shut down.
  struct Victim {
    int fd;
    std::string source;    // its address ("127.0.0.1")
    std::string name;      // what the caller named it (e.g. both ends)
    Clock::duration held;  // since it was accepted
    size_t from_source;    // connections from its source held with it
    bool over_total;       // chosen for the total cap (else the source's)
  };

  // Caps of at least 1 each.
  ConnGuard(int per_source, int total);

  // The caps derived from a descriptor limit (the soft RLIMIT_NOFILE):
  // total a quarter of it, per source a sixteenth, each at least 8 and at
  // most 2^20 (an unlimited limit counts as 2^22).
  static int DefaultTotal(rlim_t nofile);
  static int DefaultPerSource(rlim_t nofile);

  // Connection `fd` from `source` was accepted at `now` (one held under
  // the same descriptor before it is forgotten: its close was missed).
  // Returns the connections to shut down, oldest first; they are no longer
  // held. `still_idle(fd, name)` is asked of each candidate.
  using IdleCheck = std::function<bool(int fd, const std::string& name)>;
  std::vector<Victim> Accepted(int fd, const std::string& source,
                               const std::string& name, Clock::time_point now,
                               const IdleCheck& still_idle);
  // Connection `fd` closed (unknown descriptors are ignored).
  void Closed(int fd);

  size_t held() const { return by_age_.size(); }
  size_t held_from(const std::string& source) const;
  uint64_t num_shut() const { return num_shut_; }
  int per_source() const { return per_source_; }
  int total() const { return total_; }

 private:
  struct Conn {
    int fd;
    std::string source, name;
    Clock::time_point accepted;
  };
  // Removes the connection of sequence number `seq`.
  void Remove(uint64_t seq);
  // Takes into *out the oldest connection (from `source` only, unless it
  // is null) that still_idle says is idle, forgetting the older ones it
  // says are not; false when none is.
  bool TakeOldestIdle(const std::string* source, Clock::time_point now,
                      const IdleCheck& still_idle, std::vector<Victim>* out);

  const int per_source_, total_;
  uint64_t next_seq_ = 0;
  uint64_t num_shut_ = 0;
  std::map<uint64_t, Conn> by_age_;  // sequence number (accept order) -> conn
  std::unordered_map<int, uint64_t> by_fd_;
  std::unordered_map<std::string, std::set<uint64_t>> by_source_;
};

}  // namespace ps

#endif  // PS_SRC_VAN_CONN_GUARD_H_
