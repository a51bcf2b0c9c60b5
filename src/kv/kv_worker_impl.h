// KVWorkerCore::Impl: the worker's state and the functions of its push/pull
// path, declared in the order a request walks them. Three files define them:
//   kv_worker_core.cc    the request: check, slice, pull state, tracker
//                        entry, encode, filters, send (and the public API)
//   kv_worker_answer.cc  the answer: whose keys, dedup, filters, decode,
//                        store, finish
//   kv_worker_resend.cc  the kept slices (resends, PS_RESEND_TIMEOUT_MS)
//                        and the replica routing (failover, PS_REPLICAS)
// Internal to src/kv/kv_worker_*.cc.
//
// Thread-safety: Request, Wait and the Copy functions run on the caller's
// threads; OnResponse on the van's receive thread; OnFailure and Resend on
// any thread, through gate_ (never after ~Impl). kept_mu_ and resend_mu_
// guard what they name; the rest is set at construction, or thread-safe
// itself (RequestTracker, FilterChain, the postoffice's routes). placement_ and
// slicer_ are set before the first request.
#ifndef PS_SRC_KV_KV_WORKER_IMPL_H_
#define PS_SRC_KV_KV_WORKER_IMPL_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kv/call_gate.h"
#include "kv/filter_chain.h"
#include "kv/pull_state.h"
#include "kv/replica_takeover.h"
#include "kv/request_tracker.h"
#include "kv/slicer.h"
#include "postoffice/postoffice.h"
#include "ps/kv_core.h"
#include "ps/node.h"
#include "van/sync.h"

namespace ps {
namespace detail {

class KVWorkerCore::Impl {
 public:
  Impl(Node* node, int app_id, int customer_id, int val_type, size_t val_size);
  ~Impl();

  int Request(bool push, bool pull, int cmd, const RawKVPairs& kvs,
              PullSink sink, std::function<void()> callback);
  SArray<char> Copy(const void* data, size_t bytes) const;
  SArray<Key> CopyKeys(const Key* keys, size_t n) EXCLUDES(kept_mu_);
  Status Wait(int ts);
  size_t num_pending() const { return tracker_.num_pending(); }
  Status AddFilter(std::shared_ptr<Filter> filter) {
    return filters_.Add(std::move(filter));
  }
  Placement placement_;
  RawSlicer slicer_;  // null: slice by placement_

 private:
  // A slice of a request, kept until its server answers: its message as
  // the filters made it, sent again as it is (to whoever serves the keys
  // then), so that a filter's Encode runs once per slice.
  struct Unanswered {
    int ts;
    int slot;  // the server whose keys it asks for
    Message msg;
    Postoffice::Clock::time_point due;   // of the next resend
    Postoffice::Clock::time_point sent;  // first
    int sends = 1;
    bool reported = false;  // as stalled (kStallGraceMs)
  };

  // The request (kv_worker_core.cc).
  // The check and slice stages: `kvs` cut into one slice per server, by the
  // user slicer or by placement_; an error rejects the request.
  Status SliceRequest(const RawKVPairs& kvs, bool push, bool pull,
                      std::vector<KVSlice>* slices) const;
  // Runs the user slicer on `kvs` and checks its slices: one per server,
  // each a valid KV list, and (for a pull) every key sent somewhere.
  Status SliceByUser(const RawKVPairs& kvs, bool push, bool pull,
                     std::vector<KVSlice>* slices) const;
  // The ids of the servers whose keys `slices` touch; *lost: why one of
  // them cannot be served (unchanged when all can).
  std::vector<int> TouchedServers(const std::vector<KVSlice>& slices,
                                  Status* lost) const;
  // The state of a pull of `kvs` into `sink`, cut as `slices` over
  // `num_servers` touched servers: where each answer goes.
  std::shared_ptr<PullState> NewPullState(const RawKVPairs& kvs, PullSink sink,
                                          const std::vector<KVSlice>& slices,
                                          size_t num_servers) const;
  // The tracker entry of a request waiting on `servers`; returns its
  // timestamp. Its callback ends the request (metrics, the pull state, the
  // caller's callback) and holds kvs' arrays until then.
  int TrackRequest(const std::vector<int>& servers, const RawKVPairs& kvs,
                   const std::shared_ptr<PullState>& state, bool push,
                   bool pull, std::function<void()> callback);
  // The encode, filters and send stages, for each touched server.
  void SendSlices(int ts, bool push, bool pull, int cmd,
                  std::vector<KVSlice>* slices, const PullState* state);
  // The encode stage: the message of request ts for server `slot`'s keys,
  // to whoever serves them now (its replica, once it died).
  Message EncodeSlice(int ts, int slot, bool push, bool pull, int cmd,
                      const RawKVPairs& kvs);
  // Server `rank`'s part of a direct pull destination, if in shared memory
  // (and no filter may rewrite the answer).
  bool ReplyInto(const PullState& state, size_t rank, pb::SharedRef* ref);

  // The answer (kv_worker_answer.cc).
  void OnResponse(Message&& msg);
  // The error a server answered with instead of data (OK for data).
  Status RefusalOf(const Message& msg) const;
  // The filters, decode and store stages of server `server`'s answer to
  // pull `state`; a bad answer fails the pull.
  void StoreAnswer(Message* msg, PullState* state, int server) const;
  // The filters stage, then the decode stage, of server `rank`'s answer to
  // pull `state`.
  StatusOr<RawKVPairs> DecodeAnswer(Message* msg, const PullState& state,
                                    int rank) const;
  void FinishRequest(int ts, const std::shared_ptr<PullState>& state);

  // Kept slices and replica routing (kv_worker_resend.cc).
  // Who serves server `slot`'s keys now: the server, or its replica once
  // the scheduler marked it covered (the node's routes, core/routes.h).
  int ServerOf(int slot) const;
  // Addresses m to ServerOf(slot), naming the slot if it moved.
  void Route(int slot, pb::Meta* m) const;
  // The server whose keys answer `msg` is for: its sender, or the dead
  // server whose keys the sender (its replica) took over; none (counted as
  // dropped) for an answer of no server, or of one fenced off.
  std::optional<int> AnsweredSlot(const Message& msg) const;
  // Keeps a slice (before it is sent: the answer may come first).
  void KeepForResend(Unanswered&& u) EXCLUDES(resend_mu_);
  // The line that reports `u` as stalled after `waited_ms`.
  std::string DescribeStalled(const Unanswered& u, int64_t waited_ms) const;
  // Sends kept slices again (counted as resent). Their frames are the
  // caller's arrays, not copies: unchanged until the slice is answered
  // (the caller waits). A resend ZeroMQ still sends once the answer came
  // may carry bytes written since; the server, which applied the request,
  // lets it go without reading its values (RequestDedup::Seen).
  void SendAgain(const std::vector<Unanswered>& slices);
  // Sends again what is due and unanswered; forgets what needs no answer
  // any more (done, failed, timed out).
  void Resend(Postoffice::Clock::time_point now) EXCLUDES(resend_mu_);
  // Whether server's answer to ts was awaited, came already (a second
  // answer: let go), or was never asked for (the tracker says why).
  enum class Answer { kAwaited, kDuplicate, kUnknown };
  Answer Answered(int ts, int server) EXCLUDES(resend_mu_);
  void OnFailure(int id, const Status& why);
  // Replication: server `takeover.server` is covered; what it left
  // unanswered goes to its replica now.
  void FailOver(const Takeover& takeover) EXCLUDES(resend_mu_);

  Postoffice* const post_;
  FilterChain filters_{"KVWorker", [post = post_](int id) {
                         return post->van().SharesMemoryWith(id);
                       }};
  const int app_id_;
  const int customer_id_;
  const int val_type_;
  const size_t val_size_;
  const std::shared_ptr<CallGate> gate_ = std::make_shared<CallGate>();
  const bool replicated_ = post_->config().replicas > 0;
  RequestTracker tracker_;

  const int resend_ms_ = post_->config().resend_timeout_ms;  // 0: never
  // A request unanswered this long is reported as stalled, once: a dead
  // server is declared within the heartbeat timeout, and a BSP step waits
  // for the slowest worker's step besides (docs/failures.md).
  static constexpr int kStallGraceMs = 5000;
  const int64_t stall_ms_ =
      int64_t{post_->config().heartbeat_timeout_ms} + kStallGraceMs;
  // The last large key list copied (CopyKeys): never written after its
  // copy, so a request may send it again while another holds it.
  Mutex kept_mu_;
  SArray<Key> kept_keys_ GUARDED_BY(kept_mu_);
  Mutex resend_mu_;
  // Flat, unordered: a few per request in flight, searched from the end.
  // Nothing in it is sent under the lock: SendSlices sends its own message,
  // Resend and FailOver build theirs from copies.
  std::vector<Unanswered> unanswered_ GUARDED_BY(resend_mu_);
  // The last kAnsweredKept (timestamp, server) answered, a ring: a later
  // answer to one of them is a duplicate, not a stranger's (searched only
  // for an answer no request awaits).
  static constexpr size_t kAnsweredKept = 4096;
  std::vector<std::pair<int, int>> answered_ GUARDED_BY(resend_mu_);
  size_t answered_next_ GUARDED_BY(resend_mu_) = 0;
};

}  // namespace detail
}  // namespace ps

#endif  // PS_SRC_KV_KV_WORKER_IMPL_H_
