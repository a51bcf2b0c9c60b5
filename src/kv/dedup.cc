// RequestDedup: each request applied once (dedup.h).
#include "kv/dedup.h"

#include <iterator>

namespace ps {
namespace detail {

RequestDedup::Done RequestDedup::Seen(const KVMeta& req, Status* refusal) {
  MutexLock lock(&mu_);
  Recent& r = recent_[KeyOf(req)];
  Recent::Slot& slot = SlotOf(r, req.timestamp);
  if (slot.done != Done::kNew && slot.ts == req.timestamp) {
    if (slot.done == Done::kRefused) *refusal = r.refused[req.timestamp];
    return slot.done;
  }
  if (slot.done == Done::kRefused) r.refused.erase(slot.ts);
  slot.ts = req.timestamp;
  slot.done = Done::kPending;
  return Done::kNew;
}

void RequestDedup::MarkAnswered(const KVMeta& req, const Status& error) {
  MutexLock lock(&mu_);
  auto r = recent_.find(KeyOf(req));
  if (r == recent_.end()) return;
  Recent::Slot& slot = SlotOf(r->second, req.timestamp);
  if (slot.done == Done::kNew || slot.ts != req.timestamp) return;
  if (error.ok()) {
    if (slot.done == Done::kPending) slot.done = Done::kAnswered;
    return;
  }
  slot.done = Done::kRefused;
  r->second.refused[req.timestamp] =
      error.message().empty() ? Status(error.code(), "(no reason given)")
                              : error;
}

void RequestDedup::Unsee(const KVMeta& req) {
  MutexLock lock(&mu_);
  auto r = recent_.find(KeyOf(req));
  if (r == recent_.end()) return;
  Recent::Slot& slot = SlotOf(r->second, req.timestamp);
  if (slot.ts == req.timestamp && slot.done == Done::kPending) {
    slot.done = Done::kNew;
  }
}

void RequestDedup::Forget(int worker) {
  MutexLock lock(&mu_);
  for (auto it = recent_.begin(); it != recent_.end();) {
    it = it->first.worker == worker ? recent_.erase(it) : std::next(it);
  }
}

}  // namespace detail
}  // namespace ps
