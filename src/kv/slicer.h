// The KV message layer as pure functions: check a KV list, slice it by
// placement (SArray segments, no copies), and turn a slice into a Message
// and back. Frames: keys (UINT64), then values (the value type) when the
// message carries them, then lens (INT32) when per-key counts vary.
#ifndef PS_SRC_KV_SLICER_H_
#define PS_SRC_KV_SLICER_H_

#include <vector>

#include "ps/kv_core.h"
#include "ps/placement.h"
#include "ps/status.h"
#include "van/message.h"

namespace ps {

// Keys sorted ascending and unique; with vals: lens (if any) one per key,
// non-negative, summing to the value count, else a value count that is a
// multiple of the key count; vals a whole number of val_size elements.
// `keys_known`: the keys were checked before (a worker's own keys, echoed
// by the answer); their order is not checked again.
Status CheckKVPairs(const detail::RawKVPairs& kvs, size_t val_size,
                    bool with_vals, bool keys_known = false);

struct KVSlice {
  bool touched = false;  // the server holds at least one of the keys
  detail::RawKVPairs kvs;
};

// One slice per server of `placement`; kvs must pass CheckKVPairs.
std::vector<KVSlice> SliceKVPairs(const detail::RawKVPairs& kvs,
                                  size_t val_size, const Placement& placement);

// Appends kvs's frames to msg (values only when with_vals; lens when set).
// Without the keys frame when `keys_asked` (an answer with the request's
// own keys: Meta.keys_asked).
void AddKVFrames(const detail::RawKVPairs& kvs, bool with_vals, int val_type,
                 Message* msg, bool keys_asked = false);

// The copy of worker push `req` (decoded into `kvs`) that server `rank`
// forwards to its replica, node `replica` (PS_REPLICAS): the worker's
// request (Meta.origin) for `rank`'s keys (Meta.shard). Its frames are
// copies, never the received ones: those belong to the request handle,
// which may keep them and write into them (DenseShard sums a step's
// gradients into the first push's values) while ZeroMQ, on its own thread,
// still reads the copy's bytes. Borrowed values (the worker's shared
// memory) could not be mapped by the replica anyway.
Message ReplicaCopy(const KVMeta& req, const detail::RawKVPairs& kvs,
                    int val_type, int rank, int replica);

// Reads the frames of a data message back, validating them against the
// header and each other (CheckKVPairs). Never aborts on bad input. An
// answer with Meta.keys_asked takes `asked` (the keys its request asked) as
// its keys; without `asked`, such a message is refused.
StatusOr<detail::RawKVPairs> DecodeKVPairs(const Message& msg, bool with_vals,
                                           int val_type, size_t val_size,
                                           const SArray<Key>* asked = nullptr);

}  // namespace ps

#endif  // PS_SRC_KV_SLICER_H_
