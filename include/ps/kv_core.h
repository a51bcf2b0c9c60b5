// Type-erased engines behind KVWorker<Val> and KVServer<Val>: all of the
// work (slicing, encoding, sending, tracking, decoding) is done here on byte
// buffers; kv_app.h only adds types. Users include kv_app.h, not this.
//
// Thread-safety: KVWorkerCore's Request/Wait may be called from any number
// of threads at once (several Waits on one timestamp too); SetPlacement must
// not race with requests. Its destructor waits out a running failure
// callback. KVServerCore::Response/ResponseError may be called from any
// thread; SetHandle/ClearHandle from one thread at a time (not from a
// failure handle).
#ifndef PS_KV_CORE_H_
#define PS_KV_CORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "ps/base.h"
#include "ps/placement.h"
#include "ps/range.h"
#include "ps/sarray.h"
#include "ps/status.h"

namespace ps {

class Node;
class Filter;
namespace detail {
struct RequestInternals;  // src/kv/request_internals.h
}  // namespace detail

// What the server's handler learns about a request.
struct KVMeta {
  int cmd = 0;  // the user command (`head` on the wire)
  bool push = false;
  bool pull = false;
  int sender = 0;       // node id of the worker
  int timestamp = 0;    // the worker's request timestamp
  int customer_id = 0;  // the worker's customer
  int app_id = 0;
  int priority = 0;
  // Some of the request's arrays (usually the values) are the worker's own
  // memory (a ps::SharedArray it pushed from this host), not received
  // frames: valid only until the request is answered, and never to be
  // written. A handler that keeps them longer copies them. Otherwise the
  // arrays are the received frames, the handler's alone: it may keep them
  // and write into them (nothing else reads them once it has them; the
  // copy a primary forwards to its replica has its own bytes).
  bool vals_borrowed = false;
  // Replication (a replica handle, KVServer::set_replica_handle): the
  // server rank whose keys the request is for when not this server's own
  // (-1: its own).
  int shard = -1;
  // Internal: how the server answers the request (the replica chain, the
  // sender's process, a pull's asked keys and where its answer may go in
  // shared memory). A handle copies it with the meta and never reads it.
  std::shared_ptr<const detail::RequestInternals> internal;
};

namespace detail {

// Element type codes as on the wire (proto/meta.proto DataType).
enum DataTypeCode {
  kTypeChar = 0,
  kTypeInt8 = 1,
  kTypeUInt8 = 2,
  kTypeInt16 = 3,
  kTypeUInt16 = 4,
  kTypeInt32 = 5,
  kTypeUInt32 = 6,
  kTypeInt64 = 7,
  kTypeUInt64 = 8,
  kTypeFloat = 9,
  kTypeDouble = 10,
};

template <typename V>
constexpr int DataTypeOf() {
  if constexpr (std::is_same_v<V, float>)
    return kTypeFloat;
  else if constexpr (std::is_same_v<V, double>)
    return kTypeDouble;
  else if constexpr (std::is_same_v<V, char>)
    return kTypeChar;
  else if constexpr (std::is_same_v<V, int8_t>)
    return kTypeInt8;
  else if constexpr (std::is_same_v<V, uint8_t>)
    return kTypeUInt8;
  else if constexpr (std::is_same_v<V, int16_t>)
    return kTypeInt16;
  else if constexpr (std::is_same_v<V, uint16_t>)
    return kTypeUInt16;
  else if constexpr (std::is_same_v<V, int32_t>)
    return kTypeInt32;
  else if constexpr (std::is_same_v<V, uint32_t>)
    return kTypeUInt32;
  else if constexpr (std::is_same_v<V, int64_t>)
    return kTypeInt64;
  else if constexpr (std::is_same_v<V, uint64_t>)
    return kTypeUInt64;
  else
    static_assert(sizeof(V) == 0, "unsupported value type");
}

// Keys, values as bytes, and per-key value counts (empty: uniform).
struct RawKVPairs {
  SArray<Key> keys;
  SArray<char> vals;
  SArray<int> lens;
  int priority = 0;
};

// Where pulled values go. With `direct` set and no lens wanted, each
// server's answer is copied straight to its offset (uniform values per key:
// direct_bytes / keys). Otherwise answers are kept (zero-copy) and, at
// completion, either handed over as they are through `adopt` (set only for
// an empty SArray destination; used when exactly one server answered, its
// values frame is aligned for the value type, and it carries lens if lens
// are wanted) or assembled into buffers from alloc_vals / alloc_lens. With
// `assign_vals` (an empty std::vector destination), one server's answer is
// copied in as the buffer is made, with no zero fill before it.
struct PullSink {
  char* direct = nullptr;
  size_t direct_bytes = 0;
  std::function<char*(size_t bytes)> alloc_vals;
  std::function<void(const char* vals, size_t bytes)> assign_vals;
  std::function<int*(size_t count)> alloc_lens;  // null: lens not wanted
  std::function<void(const SArray<char>& vals, const SArray<int>& lens)>
      adopt;  // null: always assemble
};

// A user slicer on bytes (KVWorker::set_slicer): fills `sliced` with one
// (send?, slice) pair per server, ranges[s] being server s's key range.
using RawSliced = std::vector<std::pair<bool, RawKVPairs>>;
using RawSlicer =
    std::function<void(const RawKVPairs& kvs, const std::vector<Range>& ranges,
                       RawSliced* sliced)>;

class KVWorkerCore {
 public:
  KVWorkerCore(Node* node, int app_id, int customer_id, int val_type,
               size_t val_size);
  ~KVWorkerCore();
  // Validates, slices by placement, sends one message per touched server,
  // and returns the timestamp to Wait on. Invalid input: logged, and the
  // returned timestamp's Wait gives the error.
  int Request(bool push, bool pull, int cmd, const RawKVPairs& kvs,
              PullSink sink, std::function<void()> callback);
  Status Wait(int timestamp);
  // A copy of `bytes` bytes of the caller's (a std::vector pushed or
  // pulled), for a request: large ones go to shared memory made for the
  // request alone when this node passes references to a server (PS_SHM),
  // so they reach co-located servers without the socket.
  SArray<char> Copy(const void* data, size_t bytes);
  // Copy for a caller's key list. A large list (kKeptKeysBytes and up) is
  // kept after its request: a later request with the same keys, compared
  // byte by byte, takes the kept copy instead of a new one (a pull of what
  // was pushed, the same keys every step). One list is kept per worker;
  // none with a user slicer (SetSlicer), which may write the keys.
  SArray<Key> CopyKeys(const Key* keys, size_t n);
  static constexpr size_t kKeptKeysBytes = size_t{1} << 20;
  size_t num_pending() const;
  void SetPlacement(Placement placement);
  const Placement& placement() const;
  // Replaces slicing by placement (null: back to it). The ranges it is
  // given are the placement's. Must not race with requests.
  void SetSlicer(RawSlicer slicer);
  // Appends a filter to the chain (ps/filter.h); before the first request.
  Status AddFilter(std::shared_ptr<Filter> filter);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

using RawHandle = std::function<void(const KVMeta&, const RawKVPairs&)>;
// Told that node `id` was declared dead (-1: this node stops); any thread.
using FailureHandle = std::function<void(int id, const Status& why)>;

class KVServerCore {
 public:
  KVServerCore(Node* node, int app_id, int val_type, size_t val_size);
  ~KVServerCore();  // ClearHandle()
  Node* node() const;
  // Registers the handler; requests that arrived before wait for it.
  // `replica`: the handler of the keys this server holds for another
  // (Config::replicas), to be set before the other.
  void SetHandle(RawHandle handle, bool replica = false);
  // Unregisters the handler (and the failure handle), waiting for a running
  // one to return; later requests are held as if no handler was ever set.
  void ClearHandle(bool replica = false);
  // Called on peer failures while a handler is registered.
  void SetFailureHandle(FailureHandle handle, bool replica = false);
  // Appends a filter to the chain (ps/filter.h); before SetHandle.
  Status AddFilter(std::shared_ptr<Filter> filter);
  void Response(const KVMeta& req, const RawKVPairs& res);
  // Refuses `req`: the worker's Wait returns `error` (not OK), its message
  // prefixed with this server's name. No data is sent.
  void ResponseError(const KVMeta& req, const Status& error);
  // Replication by step (KVServer::set_replica_steps, ReplicateStep).
  bool SetReplicaSteps(std::function<bool(const KVMeta&)> stepped);
  bool ReplicateStep(int cmd, int priority, const RawKVPairs& kvs,
                     const std::vector<KVMeta>& covers);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace detail
}  // namespace ps

#endif  // PS_KV_CORE_H_
