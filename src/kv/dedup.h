// RequestDedup: the dedup stage of a server's path (resending,
// PS_RESEND_TIMEOUT_MS): a request that comes again is applied once. It
// remembers, per worker customer and shard, what became of its last
// kRecentPerCustomer timestamps: pending (seen, not answered), answered, or
// refused (with the error, to refuse a resent copy the same way).
//
// Thread-safety: any thread; one lock of its own, never held while anything
// else runs.
#ifndef PS_SRC_KV_DEDUP_H_
#define PS_SRC_KV_DEDUP_H_

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "ps/kv_core.h"
#include "ps/status.h"
#include "van/sync.h"

namespace ps {
namespace detail {

class RequestDedup {
 public:
  // What became of a request: new (now remembered), seen and not answered
  // yet, answered with data, or answered with an error.
  enum class Done : uint8_t { kNew, kPending, kAnswered, kRefused };
  // How many timestamps per worker customer are remembered: far more
  // requests than can be in flight while one is resent.
  static constexpr size_t kRecentPerCustomer = 4096;

  // What became of req before (a refusal's error in *refusal); when it is
  // new, it is remembered (forgetting the request kRecentPerCustomer
  // timestamps older, if any).
  Done Seen(const KVMeta& req, Status* refusal) EXCLUDES(mu_);
  // req was answered (error: refused).
  void MarkAnswered(const KVMeta& req, const Status& error) EXCLUDES(mu_);
  // Forgets req, seen as new (a malformed request: not remembered, as if
  // it never came; a copy of it is refused again on its own).
  void Unsee(const KVMeta& req) EXCLUDES(mu_);
  // Worker `id` was restarted: its old process's requests are forgotten.
  void Forget(int worker) EXCLUDES(mu_);

 private:
  // One worker customer's requests for one server's keys: request ts in
  // slot ts % kRecentPerCustomer (so its last kRecentPerCustomer
  // timestamps; 32 KiB, allocated at its first request).
  struct Recent {
    struct Slot {
      int ts = 0;
      Done done = Done::kNew;  // kNew: empty
    };
    std::vector<Slot> slots = std::vector<Slot>(kRecentPerCustomer);
    std::unordered_map<int, Status> refused;  // the errors, by timestamp
  };
  // (worker id, customer id, shard): a request's slices for this server's
  // keys (shard -1) and for its primary's share a timestamp. The shard is
  // as sent, not resolved to this server's rank: a request for this
  // server's own keys names none (a worker names one only for keys a
  // replica took over, a primary for the copies it forwards).
  struct Key {
    int worker, customer, shard;
    bool operator==(const Key& o) const {
      return worker == o.worker && customer == o.customer && shard == o.shard;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t h = (uint64_t{static_cast<uint32_t>(k.worker)} << 32) |
                   static_cast<uint32_t>(k.customer);
      return static_cast<size_t>((h ^ static_cast<uint32_t>(k.shard)) *
                                 0x9E3779B97F4A7C15ull);
    }
  };
  static Key KeyOf(const KVMeta& req) {
    return {req.sender, req.customer_id, req.shard};
  }
  static Recent::Slot& SlotOf(Recent& r, int ts) {
    return r.slots[static_cast<uint32_t>(ts) % kRecentPerCustomer];
  }

  Mutex mu_;
  std::unordered_map<Key, Recent, KeyHash> recent_ GUARDED_BY(mu_);
};

}  // namespace detail
}  // namespace ps

#endif  // PS_SRC_KV_DEDUP_H_
