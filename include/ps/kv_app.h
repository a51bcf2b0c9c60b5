// KVWorker<Val> and KVServer<Val>: the key-value API, ps-lite compatible
// where it can be. A worker pushes (key, values) lists to the servers and
// pulls values back; keys of one call must be sorted ascending and unique.
// Values per key are uniform (vals.size() / keys.size()) unless `lens`
// gives each key's count. Each call returns a timestamp; Wait(ts) blocks
// until every server the call touched has answered (servers holding none of
// its keys get no message) and returns an error instead of hanging when such
// a server is declared dead or PS_REQUEST_TIMEOUT_MS passes.
//
// Copies: Push/Pull on std::vector copy keys and pushed values once into
// SArrays (the caller may reuse its vectors at once); large ones (1 MiB and
// up) into shared memory made for that request when the servers are
// co-located (PS_SHM), which they map instead of receiving the bytes.
// ZPush/ZPull/ZPushPull never copy pushed values: the SArrays are handed to
// ZeroMQ as they are (keep them unchanged until Wait returns). Pulled values
// land as follows:
//  - ZPull/ZPushPull into an EMPTY SArray, answered by exactly one server:
//    zero-copy. After Wait the SArray (and `lens`, when the server sent
//    lens) points into the received ZeroMQ frame, which lives as long as
//    any copy of the SArray; it is writable and shares nothing with later
//    pulls. (A frame not aligned for Val, which ZeroMQ may deliver for small
//    answers, is copied instead.)
//  - into an empty destination answered by several servers: the answers
//    are assembled (copied once) into a fresh buffer.
//  - into a presized SArray or vector: filled in place, each server's
//    answer copied straight to its offset as it arrives when no lens are
//    asked for and values per key are uniform, else assembled at the end.
// Callbacks run on the node's receive thread: they must not block (no Wait
// inside a callback). With a callback, Wait is optional: a request with a
// callback is forgotten once done (its status stays Wait-able for a while:
// the last 256 such requests), and its pull destination is not touched
// after the callback ran.
//
// Errors: Wait returns the error of a server that refused the request
// (KVServer::ResponseError; e.g. values of another type than the server's,
// or an app no KVServer on that server registers within
// PS_CONNECT_TIMEOUT_MS), prefixed with the server's name.
//
// Placement: by default keys are split evenly over [0, PS_MAX_KEY) (the
// whole key space unless set; keys above go to the last server), as in
// ps-lite; dense models should call
// SetPlacement(Placement::ByBytes(keys, sizes, NumServers())) so each server
// holds about 1/S of the bytes. All workers must use the same placement.
// Or, as in ps-lite, set_slicer(slicer): the slicer is given each request
// and the servers' key ranges (the placement's) and says which server gets
// which keys, in any pattern (a key may even go to several servers); pulled
// values still come back in the request's key order (a key answered by
// several servers: the lowest rank's answer). This path copies pulled
// values once and never adopts a frame; the slicer runs on the calling
// thread, once per request.
//
// Thread-safety: a KVWorker may be used from any number of threads at once
// (SetPlacement before any request), several Waits on one timestamp
// included; destroying it waits out a peer-failure callback running on it.
// The server's request handle runs on the receive thread, one request at a
// time; KVServer::Response/ResponseError may be called from any thread,
// later (e.g. a BSP server answering once all pushed). The failure handle
// runs on the receive or monitor thread, possibly during a request.
#ifndef PS_KV_APP_H_
#define PS_KV_APP_H_

#include <functional>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ps/base.h"
#include "ps/filter.h"
#include "ps/kv_core.h"
#include "ps/node.h"
#include "ps/placement.h"
#include "ps/range.h"
#include "ps/sarray.h"
#include "ps/status.h"

namespace ps {

template <typename Val>
struct KVPairs {
  SArray<Key> keys;
  SArray<Val> vals;
  SArray<int> lens;  // empty: vals.size() / keys.size() values per key
  int priority = 0;
};

// Push commands understood by KVServerDefaultHandle.
constexpr int kAdd = 0;     // stored += pushed
constexpr int kAssign = 1;  // stored = pushed

namespace detail {
// The typed view of a request's or a slice's bytes (no copy).
template <typename Val>
KVPairs<Val> TypedKVPairs(const RawKVPairs& raw) {
  KVPairs<Val> kvs;
  kvs.keys = raw.keys;
  kvs.vals = SArray<Val>(raw.vals);
  kvs.lens = raw.lens;
  kvs.priority = raw.priority;
  return kvs;
}
}  // namespace detail

template <typename Val>
class KVWorker {
 public:
  using Callback = std::function<void()>;

  // On customer_id's node (ps::Start; CustomerNode). KVWorker(app_id) is
  // older ps-lite's form: customer app_id.
  explicit KVWorker(int app_id) : KVWorker(app_id, app_id) {}
  KVWorker(int app_id, int customer_id)
      : KVWorker(CustomerNode(customer_id), app_id, customer_id) {}
  // `node` must outlive this worker.
  KVWorker(Node* node, int app_id, int customer_id)
      : core_(node, app_id, customer_id, detail::DataTypeOf<Val>(),
              sizeof(Val)) {}

  int Push(const std::vector<Key>& keys, const std::vector<Val>& vals,
           const std::vector<int>& lens = {}, int cmd = 0,
           const Callback& cb = nullptr, int priority = 0) {
    return ZPush(CopyKeys(keys), Copy(vals), SArray<int>(lens), cmd, cb,
                 priority);
  }

  // `vals` (and `lens`) must stay alive until Wait returns; a presized
  // `vals` is filled in place, an empty one is resized.
  int Pull(const std::vector<Key>& keys, std::vector<Val>* vals,
           std::vector<int>* lens = nullptr, int cmd = 0,
           const Callback& cb = nullptr, int priority = 0) {
    return Send(false, true, cmd, CopyKeys(keys), SArray<Val>(), {},
                Sink(vals, lens), cb, priority);
  }

  int PushPull(const std::vector<Key>& keys, const std::vector<Val>& vals,
               std::vector<Val>* outs, std::vector<int>* lens = nullptr,
               int cmd = 0, const Callback& cb = nullptr, int priority = 0) {
    return Send(true, true, cmd, CopyKeys(keys), Copy(vals), {},
                Sink(outs, lens), cb, priority);
  }

  int ZPush(const SArray<Key>& keys, const SArray<Val>& vals,
            const SArray<int>& lens = {}, int cmd = 0,
            const Callback& cb = nullptr, int priority = 0) {
    return Send(true, false, cmd, keys, vals, lens, detail::PullSink(), cb,
                priority);
  }

  // `vals` (and `lens`) must stay alive until Wait returns.
  int ZPull(const SArray<Key>& keys, SArray<Val>* vals,
            SArray<int>* lens = nullptr, int cmd = 0,
            const Callback& cb = nullptr, int priority = 0) {
    return Send(false, true, cmd, keys, SArray<Val>(), {}, Sink(vals, lens), cb,
                priority);
  }

  int ZPushPull(const SArray<Key>& keys, const SArray<Val>& vals,
                SArray<Val>* outs, SArray<int>* lens = nullptr, int cmd = 0,
                const Callback& cb = nullptr, int priority = 0) {
    return Send(true, true, cmd, keys, vals, {}, Sink(outs, lens), cb,
                priority);
  }

  Status Wait(int timestamp) { return core_.Wait(timestamp); }

  // Requests this worker still keeps: not yet waited for, or (with a
  // callback) not yet done. For tests and leak checks.
  size_t num_pending() const { return core_.num_pending(); }

  void SetPlacement(Placement placement) {
    core_.SetPlacement(std::move(placement));
  }
  const Placement& placement() const { return core_.placement(); }

  // Appends a filter (ps/filter.h) to this worker's chain, before the first
  // request: its requests pass the chain on the way out, the answers on the
  // way in. The servers need the same filters. Error: a second filter of
  // the same name.
  Status AddFilter(std::shared_ptr<Filter> filter) {
    return core_.AddFilter(std::move(filter));
  }

  // ps-lite's slicer: sliced->at(i) = (whether server i gets a message, the
  // keys (sorted, unique) and values it gets); `sliced` comes empty, the
  // slicer resizes it to ranges.size(). ranges[i] is server i's key range.
  using SlicedKVs = std::vector<std::pair<bool, KVPairs<Val>>>;
  using Slicer =
      std::function<void(const KVPairs<Val>& send,
                         const std::vector<Range>& ranges, SlicedKVs* sliced)>;

  // Replaces slicing by placement for this worker (set before any request).
  // A slice that breaks the KV rules, a wrong number of slices, or a pulled
  // key sent to no server fails the request (its Wait returns the error).
  void set_slicer(const Slicer& slicer) {
    CHECK(slicer);
    core_.SetSlicer([slicer](const detail::RawKVPairs& raw,
                             const std::vector<Range>& ranges,
                             detail::RawSliced* out) {
      SlicedKVs sliced;
      slicer(detail::TypedKVPairs<Val>(raw), ranges, &sliced);
      out->resize(sliced.size());
      for (size_t i = 0; i < sliced.size(); ++i) {
        (*out)[i].first = sliced[i].first;
        detail::RawKVPairs& part = (*out)[i].second;
        part.keys = sliced[i].second.keys;
        part.vals = SArray<char>(sliced[i].second.vals);
        part.lens = sliced[i].second.lens;
        part.priority = sliced[i].second.priority;
      }
    });
  }

 private:
  int Send(bool push, bool pull, int cmd, const SArray<Key>& keys,
           const SArray<Val>& vals, const SArray<int>& lens,
           detail::PullSink sink, const Callback& cb, int priority) {
    detail::RawKVPairs kvs;
    kvs.keys = keys;
    kvs.vals = SArray<char>(vals);
    kvs.lens = lens;
    kvs.priority = priority;
    return core_.Request(push, pull, cmd, kvs, std::move(sink), cb);
  }

  // The request's copy of a caller's vector (KVWorkerCore::Copy), and of
  // its keys (KVWorkerCore::CopyKeys: a large list asked again is copied
  // once).
  template <typename T>
  SArray<T> Copy(const std::vector<T>& vec) {
    return SArray<T>(core_.Copy(vec.data(), vec.size() * sizeof(T)));
  }
  SArray<Key> CopyKeys(const std::vector<Key>& keys) {
    return core_.CopyKeys(keys.data(), keys.size());
  }

  // Where a pull's answer lands: straight into `vals` when it is presized;
  // an empty SArray adopts a single server's answer; else `vals` is resized
  // to the answer. Vec is std::vector or SArray.
  template <typename Vec, typename LenVec>
  static detail::PullSink Sink(Vec* vals, LenVec* lens) {
    detail::PullSink sink;
    if (!vals->empty()) {
      sink.direct = reinterpret_cast<char*>(vals->data());
      sink.direct_bytes = vals->size() * sizeof(Val);
    } else if constexpr (std::is_same_v<Vec, SArray<Val>>) {
      sink.adopt = [vals, lens](const SArray<char>& v, const SArray<int>& l) {
        *vals = SArray<Val>(v);
        if (lens != nullptr) *lens = l;
      };
    } else {
      sink.assign_vals = [vals](const char* v, size_t bytes) {
        const Val* first = reinterpret_cast<const Val*>(v);
        vals->assign(first, first + bytes / sizeof(Val));
      };
    }
    sink.alloc_vals = [vals](size_t bytes) {
      if (vals->size() * sizeof(Val) != bytes)
        vals->resize(bytes / sizeof(Val));
      return reinterpret_cast<char*>(vals->data());
    };
    if (lens != nullptr) {
      sink.alloc_lens = [lens](size_t n) {
        lens->resize(n);
        return lens->data();
      };
    }
    return sink;
  }

  detail::KVWorkerCore core_;
};

// A server's request handler as an object (a shard: ps::DenseShard,
// ps::SparseShard): the request handle and the failure handle in one,
// called directly, without a function object of its own per request.
// Handle runs on the receive thread, one request at a time; OnFailure when
// node `id` is declared dead (-1: this node stops), on the receive, monitor
// or watch thread.
template <typename Val>
class KVRequestHandler {
 public:
  virtual ~KVRequestHandler() = default;
  virtual void Handle(const KVMeta& meta, const KVPairs<Val>& data) = 0;
  virtual void OnFailure(int /*id*/, const Status& /*why*/) {}
};

template <typename Val>
class KVServer {
 public:
  using ReqHandle =
      std::function<void(const KVMeta&, const KVPairs<Val>&, KVServer*)>;

  explicit KVServer(int app_id) : KVServer(DefaultNode(), app_id) {}
  // `node` must outlive this server.
  KVServer(Node* node, int app_id)
      : core_(node, app_id, detail::DataTypeOf<Val>(), sizeof(Val)) {}

  // The node this server serves on.
  Node* node() const { return core_.node(); }

  // Requests are delivered once a handle is set (earlier ones are held).
  void set_request_handle(const ReqHandle& handle) { SetHandle(handle, false); }

  // The same with a handler object (not owned: clear_request_handle, or
  // clear_replica_handle, before it dies), which is also the failure
  // handle; `replica`: as set_replica_handle.
  void set_request_handler(KVRequestHandler<Val>* handler,
                           bool replica = false) {
    core_.SetFailureHandle(
        [handler](int id, const Status& why) { handler->OnFailure(id, why); },
        replica);
    core_.SetHandle(
        [handler](const KVMeta& meta, const detail::RawKVPairs& raw) {
          handler->Handle(meta, detail::TypedKVPairs<Val>(raw));
        },
        replica);
  }

  // Appends a filter (ps/filter.h) to this server's chain, before the
  // request handle is set: requests are undone by it on the way in, answers
  // pass it on the way out. A request rewritten by a filter this server
  // lacks is refused, naming it.
  Status AddFilter(std::shared_ptr<Filter> filter) {
    return core_.AddFilter(std::move(filter));
  }

  // Unregisters the handle (waiting for a running one to return, unless
  // called from it) and the failure handle; later requests are held, then
  // refused (NotFound) after PS_CONNECT_TIMEOUT_MS. For a handle object that
  // dies before this server.
  void clear_request_handle() { core_.ClearHandle(); }

  // Runs when node `id` is declared dead (-1: this node stops), while a
  // request handle is set; on the receive or monitor thread.
  void set_failure_handle(
      const std::function<void(int id, const Status& why)>& handle) {
    core_.SetFailureHandle(handle);
  }

  // Replication (Config::replicas = 1, PS_REPLICAS): this server also holds
  // the keys of server PrimaryOf(rank): the pushes that server gets are
  // forwarded here, or what its handle sends instead (ReplicateStep; then
  // KVMeta::sender is that server), and answered only once this handle
  // answered them, and
  // when that server dies, workers send its requests here. This handle
  // serves them, with KVMeta::shard naming that rank; set it (and its
  // failure handle) before set_request_handle.
  void set_replica_handle(const ReqHandle& handle) { SetHandle(handle, true); }
  void clear_replica_handle() { core_.ClearHandle(true); }
  void set_replica_failure_handle(
      const std::function<void(int id, const Status& why)>& handle) {
    core_.SetFailureHandle(handle, true);
  }

  // Replication by step (PS_REPLICAS=1, on a primary): the pushes for which
  // `stepped(req)` holds are not copied to the replica one by one; the
  // handle sends the replica, once, what they changed (ReplicateStep), and
  // their answers wait for the replica's answer to that. Before
  // set_request_handle; `stepped` runs on the receive thread. False (and
  // nothing changes) without replicas.
  bool set_replica_steps(std::function<bool(const KVMeta&)> stepped) {
    return core_.SetReplicaSteps(std::move(stepped));
  }

  // Sends this server's replica `kvs` under `cmd` as this server's own push
  // (its replica handle sees KVMeta::sender = this server, KVMeta::priority
  // = `priority`), in place of the pushes `covers`, whose answers (given
  // before or after) wait for the replica's answer to it. False when
  // nothing was sent: no replica (any more), or set_replica_steps was not
  // called; the answers then go as they are given.
  bool ReplicateStep(int cmd, int priority, const KVPairs<Val>& kvs,
                     const std::vector<KVMeta>& covers) {
    detail::RawKVPairs raw;
    raw.keys = kvs.keys;
    raw.vals = SArray<char>(kvs.vals);
    raw.lens = kvs.lens;
    return core_.ReplicateStep(cmd, priority, raw, covers);
  }

  // Answers `req`: an empty `res` for a push, the values for a pull.
  void Response(const KVMeta& req, const KVPairs<Val>& res = KVPairs<Val>()) {
    detail::RawKVPairs raw;
    raw.keys = res.keys;
    raw.vals = SArray<char>(res.vals);
    raw.lens = res.lens;
    core_.Response(req, raw);
  }

  // Refuses `req` (instead of Response): the worker's Wait returns `error`
  // (not OK), its message prefixed with this server's name.
  void ResponseError(const KVMeta& req, const Status& error) {
    core_.ResponseError(req, error);
  }

 private:
  void SetHandle(const ReqHandle& handle, bool replica) {
    core_.SetHandle(
        [this, handle](const KVMeta& meta, const detail::RawKVPairs& raw) {
          handle(meta, detail::TypedKVPairs<Val>(raw), this);
        },
        replica);
  }

  detail::KVServerCore core_;
};

// A plain key-value store: a push adds into the stored values (kAssign
// assigns; a key seen first, or with a new length, is assigned); a pull
// returns the stored values with their lengths (unknown keys: length 0).
// Runs on the receive thread only, so it needs no lock.
template <typename Val>
struct KVServerDefaultHandle {
  void operator()(const KVMeta& req, const KVPairs<Val>& data,
                  KVServer<Val>* server) {
    size_t n = data.keys.size();
    KVPairs<Val> res;
    if (req.push) {
      size_t k = (n == 0 || !data.lens.empty()) ? 0 : data.vals.size() / n;
      const Val* src = data.vals.data();
      for (size_t i = 0; i < n; ++i) {
        size_t len = data.lens.empty() ? k : static_cast<size_t>(data.lens[i]);
        std::vector<Val>& stored = store[data.keys[i]];
        if (req.cmd == kAssign || stored.size() != len) {
          stored.assign(src, src + len);
        } else {
          for (size_t j = 0; j < len; ++j) stored[j] += src[j];
        }
        src += len;
      }
    }
    if (req.pull) {
      res.keys = data.keys;
      res.lens.resize(n);
      size_t total = 0;
      for (size_t i = 0; i < n; ++i) {
        auto it = store.find(data.keys[i]);
        res.lens[i] =
            it == store.end() ? 0 : static_cast<int>(it->second.size());
        total += res.lens[i];
      }
      res.vals.resize(total);
      Val* dst = res.vals.data();
      for (size_t i = 0; i < n; ++i) {
        auto it = store.find(data.keys[i]);
        if (it == store.end()) continue;
        std::copy(it->second.begin(), it->second.end(), dst);
        dst += it->second.size();
      }
    }
    server->Response(req, res);
  }

  std::unordered_map<Key, std::vector<Val>> store;
};

}  // namespace ps

#endif  // PS_KV_APP_H_
