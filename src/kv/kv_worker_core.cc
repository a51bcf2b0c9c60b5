// KVWorkerCore: the worker's push/pull path, one function a stage. This
// file holds the request, from the caller to the send, and the public API;
// kv_worker_answer.cc the answer, kv_worker_resend.cc the kept slices and
// the replica routing (the class: kv_worker_impl.h).
//   Request -> check and slice: SliceRequest (CheckKVPairs, SliceKVPairs)
//   -> TouchedServers -> NewPullState -> TrackRequest -> SendSlices, for
//   each server: encode: EncodeSlice (Route, AddKVFrames) -> filters
//   (FilterChain::Encode) -> KeepForResend -> send (Postoffice::Send)
//   ... OnResponse: whose keys (AnsweredSlot) -> dedup (Answered) ->
//   StoreAnswer: filters (FilterChain::Decode) -> decode (DecodeKVPairs) ->
//   PullState::Store -> RequestTracker::Answer -> FinishRequest
//   (PullState::Assemble, RequestTracker::Finish).
// A pull into a ps::SharedArray asks a co-located server to write its answer
// in place (ReplyInto); PullState::Store then finds it already there. A
// server may refuse a request (an answer with control.error and no frames):
// the request then ends with that error, naming the server.
// A user slicer (SetSlicer) takes a simpler path: SliceByUser checks its
// slices, and the pulled values are assembled key by key, since its slices
// need not be contiguous runs of the request's keys.
// Resending (PS_RESEND_TIMEOUT_MS): each slice is kept until its server
// answers (KeepForResend, filtered, before it is sent); Resend (on the
// monitor thread's tick) sends that message again when due, and
// OnResponse lets go of a second answer (Answered). The server
// applies a request once (RequestDedup::Seen). With the default timer
// (PS_RESEND_TIMEOUT_MS unset) the Postoffice below also resends each
// request and answer its receiver did not acknowledge within the peer's
// measured RTO (src/postoffice/resender.h); this resend, at 1000 ms, is
// then the backstop. Replication (PS_REPLICAS): the node's routes
// (src/postoffice/routes.h, published with the membership) say who serves
// each server's keys. When a server dies and its replica takes over
// (OnFailure: Routes::ServerOf is the replica, then FailOver), its slices
// go to the replica naming the dead server's rank (Meta.shard), what it
// left unanswered among them at once; when it dies for good, its keys and
// those it had taken over (Routes::CoveredBy) are lost, and requests
// touching them are refused (Routes::Unserved).
#include <chrono>
#include <cstring>
#include <unordered_set>

#include "kv/kv_worker_impl.h"
#include "van/shm.h"

namespace ps {
namespace detail {

KVWorkerCore::Impl::Impl(Node* node, int app_id, int customer_id, int val_type,
                         size_t val_size)
    : post_(node->postoffice()),
      app_id_(app_id),
      customer_id_(customer_id),
      val_type_(val_type),
      val_size_(val_size),
      tracker_(node->config().wait_spin_us,
               [post = post_](int id) { return post->DescribeNode(id); }) {
  placement_ = Placement::EvenKeys(node->num_servers(), node->config().max_key);
  // Failures may be delivered on any thread, also while this worker is
  // being destroyed: the gate keeps them off a destroyed one.
  post_->RegisterCustomer(
      false, app_id, customer_id,
      [this](Message&& msg) { OnResponse(std::move(msg)); },
      [this, gate = gate_](const core::PeerEvent& e) {
        if (e.kind == core::PeerEvent::kPeerRejoined) return;
        gate->Call([&] { OnFailure(e.id, e.Told()); });
      },
      resend_ms_ == 0 ? Postoffice::TickHandler()
                      : [this, gate = gate_](
                            Postoffice::Clock::time_point
                                now) { gate->Call([&] { Resend(now); }); });
}

KVWorkerCore::Impl::~Impl() {
  post_->UnregisterCustomer(false, app_id_, customer_id_);
  gate_->Close();
}

int KVWorkerCore::Impl::Request(bool push, bool pull, int cmd,
                                const RawKVPairs& kvs, PullSink sink,
                                std::function<void()> callback) {
  std::vector<KVSlice> slices;
  Status st = SliceRequest(kvs, push, pull, &slices);
  if (!st.ok()) {
    LOG(ERROR) << "KVWorker request rejected: " << st.message();
    return tracker_.StartFailed(st);
  }
  std::vector<int> servers = TouchedServers(slices, &st);
  if (!st.ok()) return tracker_.StartFailed(st);
  std::shared_ptr<PullState> state;
  if (pull) state = NewPullState(kvs, std::move(sink), slices, servers.size());
  int ts = TrackRequest(servers, kvs, state, push, pull, std::move(callback));
  SendSlices(ts, push, pull, cmd, &slices, state.get());
  return ts;
}

Status KVWorkerCore::Impl::SliceRequest(const RawKVPairs& kvs, bool push,
                                        bool pull,
                                        std::vector<KVSlice>* slices) const {
  Status st = CheckKVPairs(kvs, val_size_, push);
  if (!st.ok()) return st;
  if (slicer_) return SliceByUser(kvs, push, pull, slices);
  *slices = SliceKVPairs(kvs, val_size_, placement_);
  return Status::OK();
}

Status KVWorkerCore::Impl::SliceByUser(const RawKVPairs& kvs, bool push,
                                       bool pull,
                                       std::vector<KVSlice>* slices) const {
  const int num_servers = placement_.num_servers();
  std::vector<Range> ranges;
  for (int s = 0; s < num_servers; ++s) {
    ranges.emplace_back(placement_.begin(s), placement_.end(s));
  }
  RawSliced sliced;
  slicer_(kvs, ranges, &sliced);
  if (sliced.size() != ranges.size()) {
    return Status::InvalidArgument(
        "the slicer gave " + std::to_string(sliced.size()) + " slices for " +
        std::to_string(ranges.size()) + " servers");
  }
  slices->assign(sliced.size(), KVSlice());
  std::unordered_set<Key> sent;
  for (size_t s = 0; s < sliced.size(); ++s) {
    RawKVPairs& part = sliced[s].second;
    // A slice without keys sends nothing (as placement slicing).
    if (!sliced[s].first || part.keys.empty()) continue;
    Status st = CheckKVPairs(part, val_size_, push);
    if (!st.ok()) {
      return Status::InvalidArgument("the slicer's slice for server " +
                                     std::to_string(s) + ": " + st.message());
    }
    if (pull) sent.insert(part.keys.begin(), part.keys.end());
    part.priority = kvs.priority;
    (*slices)[s].touched = true;
    (*slices)[s].kvs = std::move(part);
  }
  if (!pull) return Status::OK();
  for (Key key : kvs.keys) {
    if (sent.count(key) == 0) {
      return Status::InvalidArgument("the slicer sent pulled key " +
                                     std::to_string(key) + " to no server");
    }
  }
  return Status::OK();
}

std::vector<int> KVWorkerCore::Impl::TouchedServers(
    const std::vector<KVSlice>& slices, Status* lost) const {
  std::vector<int> servers;
  for (size_t s = 0; s < slices.size(); ++s) {
    if (!slices[s].touched) continue;
    servers.push_back(ServerRankToId(static_cast<int>(s)));
  }
  // Keys a server lost for good, or that its replica lost with it.
  const std::shared_ptr<const core::Routes> routes = post_->routes();
  if (routes->down.empty()) return servers;
  for (int id : servers) {
    Status why = routes->Unserved(id);
    if (!why.ok()) *lost = why;
  }
  return servers;
}

std::shared_ptr<PullState> KVWorkerCore::Impl::NewPullState(
    const RawKVPairs& kvs, PullSink sink, const std::vector<KVSlice>& slices,
    size_t num_servers) const {
  auto state = std::make_shared<PullState>();
  state->sink = std::move(sink);
  state->keys = kvs.keys;
  state->val_size = val_size_;
  if (slicer_) {
    state->by_key = true;
    for (const KVSlice& slice : slices) state->asked.push_back(slice.kvs.keys);
  } else {
    state->cut = placement_.Slice(kvs.keys.data(), kvs.keys.size());
  }
  if (state->sink.direct != nullptr && !state->sink.alloc_lens &&
      !state->by_key) {
    state->place = PullState::DirectPlaces(state->cut, num_servers,
                                           state->sink.direct_bytes, val_size_);
  }
  return state;
}

int KVWorkerCore::Impl::TrackRequest(const std::vector<int>& servers,
                                     const RawKVPairs& kvs,
                                     const std::shared_ptr<PullState>& state,
                                     bool push, bool pull,
                                     std::function<void()> callback) {
  // The tracker entry and the pull state (its payload) exist before any
  // answer can come. The entry's callback also holds the request's arrays
  // until every server answered (or failed): a frame sent as a shared-memory
  // reference holds no reference of its own, and the caller may drop its
  // arrays at once. With a callback the caller need not Wait: the entry is
  // forgotten once done, and the sink is not touched after the callback.
  const bool forget = callback != nullptr;
  // Nothing to wait for: the (empty) answer is assembled before the entry
  // is done at once.
  // (It cannot fail: no answers, no error.)
  if (servers.empty() && state) state->Assemble().IgnoreError();
  std::weak_ptr<PullState> weak_state = state;
  // ps_request_seconds: from here to the last answer (or the failure).
  const auto started = Postoffice::Clock::now();
  Metrics* metrics = &post_->metrics();
  return tracker_.Start(
      servers,
      [kvs, weak_state, callback = std::move(callback), started, metrics, push,
       pull] {
        metrics->RequestDone(
            push, pull,
            std::chrono::duration<double>(Postoffice::Clock::now() - started)
                .count());
        if (auto s = weak_state.lock()) s->Abandon();  // after a late copy
        if (callback) callback();
      },
      forget, state);
}

void KVWorkerCore::Impl::SendSlices(int ts, bool push, bool pull, int cmd,
                                    std::vector<KVSlice>* slices,
                                    const PullState* state) {
  const Postoffice::Clock::time_point sent = Postoffice::Clock::now();
  const Postoffice::Clock::time_point due =  // of the first resend
      sent + std::chrono::milliseconds(resend_ms_);
  for (size_t s = 0; s < slices->size(); ++s) {
    KVSlice& slice = (*slices)[s];
    if (!slice.touched) continue;
    const int slot = ServerRankToId(static_cast<int>(s));
    Message msg = EncodeSlice(ts, slot, push, pull, cmd, slice.kvs);
    // Values copied out of the answer (into a std::vector) may come in
    // shared memory (KVMeta::share_answer).
    if (state != nullptr && !state->sink.adopt && state->sink.direct == nullptr)
      msg.meta.set_share_answer(true);
    // The filters stage, then the send stage.
    Status st = filters_.Encode(&msg);
    if (!st.ok()) {
      tracker_.FailServer(slot, st);
      continue;
    }
    if (resend_ms_ > 0) KeepForResend({ts, slot, msg, due, sent});
    pb::SharedRef into;
    if (state != nullptr && ReplyInto(*state, s, &into)) {
      // The van drops it for remote servers; a resend goes without it.
      *msg.meta.mutable_reply_into() = into;
    }
    st = post_->Send(&msg);
    if (!st.ok()) tracker_.FailServer(slot, st);
  }
}

Message KVWorkerCore::Impl::EncodeSlice(int ts, int slot, bool push, bool pull,
                                        int cmd, const RawKVPairs& kvs) {
  Message msg;
  pb::Meta& m = msg.meta;
  m.set_app_id(app_id_);
  m.set_customer_id(customer_id_);
  m.set_timestamp(ts);
  m.set_request(true);
  m.set_push(push);
  m.set_pull(pull);
  m.set_head(cmd);
  Route(slot, &m);
  AddKVFrames(kvs, push, val_type_, &msg);
  return msg;
}

bool KVWorkerCore::Impl::ReplyInto(const PullState& state, size_t rank,
                                   pb::SharedRef* ref) {
  if (state.place.empty() || !filters_.empty()) return false;
  const size_t bytes = state.place[rank + 1] - state.place[rank];
  if (!post_->FindShared(state.sink.direct + state.place[rank], bytes, ref)) {
    return false;
  }
  ref->set_bytes(bytes);
  return true;
}

SArray<char> KVWorkerCore::Impl::Copy(const void* data, size_t bytes) const {
  bool shared = false;
  // A region made for one message lives as long as the message is kept,
  // which only a job that resends does until its answer (without resends
  // it could be gone before the server maps it).
  if (bytes >= kSharedCopyBytes && resend_ms_ > 0) {
    for (int id : post_->GetNodeIds(kServerGroup)) {
      shared = shared || post_->van().SharesMemoryWith(id);
    }
  }
  return CopyForMessage(data, bytes, shared);
}

SArray<Key> KVWorkerCore::Impl::CopyKeys(const Key* keys, size_t n) {
  const size_t bytes = n * sizeof(Key);
  // A user slicer is handed the request's keys and may write them.
  if (bytes < kKeptKeysBytes || slicer_) {
    return SArray<Key>(Copy(keys, bytes));
  }
  SArray<Key> kept;
  {
    MutexLock lock(&kept_mu_);
    kept = kept_keys_;
  }
  // Compared outside the lock: the kept array is never written.
  if (kept.size() == n && std::memcmp(kept.data(), keys, bytes) == 0) {
    return kept;
  }
  SArray<Key> copy(Copy(keys, bytes));
  MutexLock lock(&kept_mu_);
  kept_keys_ = copy;
  return copy;
}

KVWorkerCore::KVWorkerCore(Node* node, int app_id, int customer_id,
                           int val_type, size_t val_size)
    : impl_(std::make_unique<Impl>(node, app_id, customer_id, val_type,
                                   val_size)) {}
KVWorkerCore::~KVWorkerCore() = default;

int KVWorkerCore::Request(bool push, bool pull, int cmd, const RawKVPairs& kvs,
                          PullSink sink, std::function<void()> callback) {
  return impl_->Request(push, pull, cmd, kvs, std::move(sink),
                        std::move(callback));
}
Status KVWorkerCore::Wait(int timestamp) { return impl_->Wait(timestamp); }
SArray<char> KVWorkerCore::Copy(const void* data, size_t bytes) {
  return impl_->Copy(data, bytes);
}
SArray<Key> KVWorkerCore::CopyKeys(const Key* keys, size_t n) {
  return impl_->CopyKeys(keys, n);
}
size_t KVWorkerCore::num_pending() const { return impl_->num_pending(); }
void KVWorkerCore::SetPlacement(Placement placement) {
  CHECK(placement.valid());
  impl_->placement_ = std::move(placement);
}
const Placement& KVWorkerCore::placement() const { return impl_->placement_; }
void KVWorkerCore::SetSlicer(RawSlicer slicer) {
  impl_->slicer_ = std::move(slicer);
}
Status KVWorkerCore::AddFilter(std::shared_ptr<Filter> filter) {
  return impl_->AddFilter(std::move(filter));
}

}  // namespace detail
}  // namespace ps
