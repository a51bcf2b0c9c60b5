// KVWorkerCore: the worker's push/pull path, one function a stage:
//   Request (CheckKVPairs) -> slice: SliceKVPairs -> SendSlices, for each
//   server: encode: EncodeSlice (AddKVFrames) -> filters
//   (FilterChain::Encode) -> send (Postoffice::Send)
//   ... OnResponse: dedup (Answered) -> filters (FilterChain::Decode) ->
//   decode (DecodeKVPairs) -> PullState::Store -> RequestTracker::Answer ->
//   FinishRequest (PullState::Assemble, RequestTracker::Finish).
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
// then the backstop. Replication (PS_REPLICAS):
// ReplicaRoutes (src/kv/replica_takeover.h) says who serves each server's
// keys. When a server dies and its replica takes over (OnFailure:
// ReplicaRoutes::Cover, then FailOver), its slices go to the replica naming
// the dead server's rank (Meta.shard), what it left unanswered among them
// at once; when it dies for good (ReplicaRoutes::Lose), its keys and those
// it had taken over are lost, and requests touching them are refused.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "kv/call_gate.h"
#include "kv/filter_chain.h"
#include "kv/pull_state.h"
#include "kv/replica_takeover.h"
#include "kv/request_tracker.h"
#include "kv/slicer.h"
#include "postoffice/postoffice.h"
#include "ps/kv_core.h"
#include "ps/node.h"
#include "van/shm.h"
#include "van/sync.h"

namespace ps {
namespace detail {

class KVWorkerCore::Impl {
 public:
  Impl(Node* node, int app_id, int customer_id, int val_type, size_t val_size)
      : post_(node->postoffice()),
        app_id_(app_id),
        customer_id_(customer_id),
        val_type_(val_type),
        val_size_(val_size),
        routes_(node->num_servers()),
        tracker_(node->config().wait_spin_us,
                 [post = post_](int id) { return post->DescribeNode(id); }) {
    placement_ =
        Placement::EvenKeys(node->num_servers(), node->config().max_key);
    // Failures may be delivered on any thread, also while this worker is
    // being destroyed: the gate keeps them off a destroyed one.
    post_->RegisterCustomer(
        false, app_id, customer_id,
        [this](Message&& msg) { OnResponse(std::move(msg)); },
        [this, gate = gate_](int id, const Status& why) {
          gate->Call([&] { OnFailure(id, why); });
        },
        resend_ms_ == 0 ? Postoffice::TickHandler()
                        : [this, gate = gate_](
                              Postoffice::Clock::time_point
                                  now) { gate->Call([&] { Resend(now); }); });
    // Servers whose replica took their keys over before this worker was
    // made (or before this node rejoined the job): their keys go there.
    if (node->config().replicas > 0) {
      for (int id : post_->GetNodeIds(kServerGroup)) {
        if (post_->TakenOver(id)) routes_.Cover(id);
      }
    }
  }
  ~Impl() {
    post_->UnregisterCustomer(false, app_id_, customer_id_);
    gate_->Close();
  }

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
  // The ids of the servers whose keys `slices` touch; *lost: why one of
  // them cannot be served (unchanged when all can).
  std::vector<int> TouchedServers(const std::vector<KVSlice>& slices,
                                  Status* lost) const;
  // Runs the user slicer on `kvs` and checks its slices: one per server,
  // each a valid KV list, and (for a pull) every key sent somewhere.
  Status SliceByUser(const RawKVPairs& kvs, bool push, bool pull,
                     std::vector<KVSlice>* slices) const;
  void SendSlices(int ts, bool push, bool pull, int cmd,
                  std::vector<KVSlice>* slices, const PullState* state);
  // The encode stage: the message of request ts for server `slot`'s keys,
  // to whoever serves them now (its replica, once it died).
  Message EncodeSlice(int ts, int slot, bool push, bool pull, int cmd,
                      const RawKVPairs& kvs);
  // To whoever serves server `slot`'s keys now (its replica, once it died).
  void Route(int slot, pb::Meta* m) const;
  // Server `rank`'s part of a direct pull destination, if in shared memory
  // (and no filter may rewrite the answer).
  bool ReplyInto(const PullState& state, size_t rank, pb::SharedRef* ref);
  void OnResponse(Message&& msg);
  // The error a server answered with instead of data (OK for data).
  Status RefusalOf(const Message& msg) const;
  // The filters stage, then the decode stage, of server `rank`'s answer to
  // pull `state`.
  StatusOr<RawKVPairs> DecodeAnswer(Message* msg, const PullState& state,
                                    int rank) const;
  void FinishRequest(int ts, const std::shared_ptr<PullState>& state);
  void OnFailure(int id, const Status& why);
  // A slice of a request, kept until its server answers: its message as
  // the filters made it, sent again as it is (to whoever serves the keys
  // then), so that a filter's Encode runs once per slice.
  struct Unanswered {
    int ts;
    int slot;  // the server whose keys it asks for
    Message msg;
    Postoffice::Clock::time_point due;  // of the next resend
    int sends = 1;
  };
  // Keeps a slice (before it is sent: the answer may come first).
  void KeepForResend(Unanswered&& u) EXCLUDES(resend_mu_);
  // Sends kept slices again (counted as resent). Their frames are the
  // caller's arrays, not copies: unchanged until the slice is answered
  // (the caller waits). A resend ZeroMQ still sends once the answer came
  // may carry bytes written since; the server, which applied the request,
  // lets it go without reading its values (RequestDedup::Seen).
  void SendAgain(const std::vector<Unanswered>& slices);
  // Replication: server `takeover.server` is covered; what it left
  // unanswered goes to its replica now.
  void FailOver(const Takeover& takeover) EXCLUDES(resend_mu_);
  // Sends again what is due and unanswered; forgets what needs no answer
  // any more (done, failed, timed out).
  void Resend(Postoffice::Clock::time_point now) EXCLUDES(resend_mu_);
  // Whether server's answer to ts was awaited, came already (a second
  // answer: let go), or was never asked for (the tracker says why).
  enum class Answer { kAwaited, kDuplicate, kUnknown };
  Answer Answered(int ts, int server) EXCLUDES(resend_mu_);

  Postoffice* const post_;
  FilterChain filters_{"KVWorker", [post = post_](int id) {
                         return post->van().SharesMemoryWith(id);
                       }};
  const int app_id_;
  const int customer_id_;
  const int val_type_;
  const size_t val_size_;
  const std::shared_ptr<CallGate> gate_ = std::make_shared<CallGate>();
  ReplicaRoutes routes_;
  RequestTracker tracker_;

  const int resend_ms_ = post_->config().resend_timeout_ms;  // 0: never
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

int KVWorkerCore::Impl::Request(bool push, bool pull, int cmd,
                                const RawKVPairs& kvs, PullSink sink,
                                std::function<void()> callback) {
  Status st = CheckKVPairs(kvs, val_size_, push);
  if (!st.ok()) {
    LOG(ERROR) << "KVWorker request rejected: " << st.message();
    return tracker_.StartFailed(st);
  }
  std::vector<KVSlice> slices;
  if (slicer_) {
    st = SliceByUser(kvs, push, pull, &slices);
    if (!st.ok()) {
      LOG(ERROR) << "KVWorker request rejected: " << st.message();
      return tracker_.StartFailed(st);
    }
  } else {
    slices = SliceKVPairs(kvs, val_size_, placement_);
  }
  std::vector<int> servers = TouchedServers(slices, &st);
  if (!st.ok()) return tracker_.StartFailed(st);
  std::shared_ptr<PullState> state;
  if (pull) {
    state = std::make_shared<PullState>();
    state->sink = std::move(sink);
    state->keys = kvs.keys;
    state->val_size = val_size_;
    if (slicer_) {
      state->by_key = true;
      for (const KVSlice& slice : slices)
        state->asked.push_back(slice.kvs.keys);
    } else {
      state->cut = placement_.Slice(kvs.keys.data(), kvs.keys.size());
    }
    if (state->sink.direct != nullptr && !state->sink.alloc_lens &&
        !state->by_key) {
      state->place = PullState::DirectPlaces(
          state->cut, servers.size(), state->sink.direct_bytes, val_size_);
    }
  }
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
  int ts = tracker_.Start(
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
  SendSlices(ts, push, pull, cmd, &slices, state.get());
  return ts;
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

std::vector<int> KVWorkerCore::Impl::TouchedServers(
    const std::vector<KVSlice>& slices, Status* lost) const {
  std::vector<int> servers;
  for (size_t s = 0; s < slices.size(); ++s) {
    if (!slices[s].touched) continue;
    servers.push_back(ServerRankToId(static_cast<int>(s)));
  }
  Status why = routes_.Unserved(servers);
  if (!why.ok()) *lost = why;
  return servers;
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

void KVWorkerCore::Impl::SendSlices(int ts, bool push, bool pull, int cmd,
                                    std::vector<KVSlice>* slices,
                                    const PullState* state) {
  Postoffice::Clock::time_point due;  // of the first resend
  if (resend_ms_ > 0) {
    due = Postoffice::Clock::now() + std::chrono::milliseconds(resend_ms_);
  }
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
    if (resend_ms_ > 0) KeepForResend({ts, slot, msg, due});
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

void KVWorkerCore::Impl::Route(int slot, pb::Meta* m) const {
  const int to = routes_.RouteOf(slot);
  m->set_recver(to);
  if (to != slot) {
    m->set_shard(IdToRank(slot));  // taken over
  } else {
    m->clear_shard();
  }
}

void KVWorkerCore::Impl::KeepForResend(Unanswered&& u) {
  MutexLock lock(&resend_mu_);
  unanswered_.push_back(std::move(u));
}

void KVWorkerCore::Impl::SendAgain(const std::vector<Unanswered>& slices) {
  for (const Unanswered& u : slices) {
    Message msg = u.msg;
    Route(u.slot, &msg.meta);
    post_->CountResent();
    if (post_->config().verbose >= 1) {
      LOG(INFO) << "resending " << DebugString(msg);
    }
    Status st = post_->Send(&msg);
    if (!st.ok()) {
      LOG(WARNING) << "resend to " << post_->DescribeNode(msg.meta.recver())
                   << " failed: " << st;
    }
  }
}

void KVWorkerCore::Impl::FailOver(const Takeover& takeover) {
  LOG(WARNING) << "requests for " << post_->DescribeNode(takeover.server)
               << " go to " << post_->DescribeNode(takeover.replica)
               << ", its replica";
  std::vector<Unanswered> again;
  {
    MutexLock lock(&resend_mu_);
    auto due = Postoffice::Clock::now() + std::chrono::milliseconds(resend_ms_);
    for (Unanswered* u : takeover.Moved(&unanswered_)) {
      u->due = due;
      again.push_back(*u);
    }
  }
  SendAgain(again);
}

void KVWorkerCore::Impl::Resend(Postoffice::Clock::time_point now) {
  // The wait doubles with every send, up to this many timeouts: a large
  // message on a slow link is not sent again and again while it travels.
  constexpr int kMaxBackoff = 16;
  std::vector<Unanswered> due;
  {
    MutexLock lock(&resend_mu_);
    for (size_t i = 0; i < unanswered_.size();) {
      Unanswered& u = unanswered_[i];
      if (!tracker_.Awaits(u.ts, u.slot)) {
        if (&u != &unanswered_.back()) u = std::move(unanswered_.back());
        unanswered_.pop_back();
        continue;
      }
      if (now >= u.due) {
        int backoff = std::min(kMaxBackoff, 1 << std::min(u.sends, 4));
        u.due = now + std::chrono::milliseconds(int64_t{resend_ms_} * backoff);
        ++u.sends;
        due.push_back(u);
      }
      ++i;
    }
  }
  // To whoever serves those keys now (a replica, after a failover).
  SendAgain(due);
}

KVWorkerCore::Impl::Answer KVWorkerCore::Impl::Answered(int ts, int server) {
  MutexLock lock(&resend_mu_);
  // From the end: the newest requests are the likeliest answered.
  auto it = std::find_if(
      unanswered_.rbegin(), unanswered_.rend(),
      [&](const Unanswered& u) { return u.ts == ts && u.slot == server; });
  std::pair<int, int> key{ts, server};
  if (it == unanswered_.rend()) {
    return std::find(answered_.begin(), answered_.end(), key) != answered_.end()
               ? Answer::kDuplicate
               : Answer::kUnknown;
  }
  if (it != unanswered_.rbegin()) *it = std::move(unanswered_.back());
  unanswered_.pop_back();
  if (answered_.size() < kAnsweredKept) {
    answered_.push_back(key);
  } else {
    answered_[answered_next_] = key;
    answered_next_ = (answered_next_ + 1) % kAnsweredKept;
  }
  return Answer::kAwaited;
}

void KVWorkerCore::Impl::OnResponse(Message&& msg) {
  int ts = msg.meta.timestamp();
  // The server whose keys were asked for: the sender, or the dead server
  // whose keys the sender (its replica) took over.
  int sender = msg.meta.sender();
  if (!IsServerId(sender)) {
    post_->CountDropped(sender, "a worker takes answers from servers only: " +
                                    DebugString(msg));
    return;
  }
  if (msg.meta.has_shard()) {
    const int slot = ServerRankToId(msg.meta.shard());
    if (routes_.RouteOf(slot) != sender) {
      post_->CountDropped(sender, "an answer for server " +
                                      std::to_string(msg.meta.shard()) +
                                      "'s keys, which it does not serve");
      return;
    }
    sender = slot;
  } else if (routes_.RouteOf(sender) != sender) {
    // Its keys moved to its replica: it was declared dead, and is back
    // (frozen or cut off): fenced, whatever it answers is of the past.
    post_->CountDropped(sender,
                        "an answer of a server whose keys moved to "
                        "its replica (fenced): " +
                            DebugString(msg));
    return;
  }
  // A resent request answered twice: the second answer must not touch the
  // caller's memory again. (One never asked for goes on, for the tracker
  // to name.)
  if (resend_ms_ > 0 && Answered(ts, sender) == Answer::kDuplicate) {
    post_->CountDuplicate();
    return;
  }
  std::shared_ptr<PullState> state;
  if (msg.meta.pull()) {
    state = std::static_pointer_cast<PullState>(tracker_.Payload(ts));
  }
  Status refused = RefusalOf(msg);
  if (state && !refused.ok()) {
    state->Fail(refused);
  } else if (state) {
    StatusOr<RawKVPairs> kvs = DecodeAnswer(&msg, *state, IdToRank(sender));
    Status st = kvs.ok()
                    ? state->Store(IdToRank(sender), std::move(kvs).value())
                    : kvs.status();
    if (!st.ok()) {
      post_->CountDropped(sender, "bad pull answer: " + st.message());
      state->Fail(Status::Corruption(post_->DescribeNode(sender) +
                                     " answered badly: " + st.message()));
    }
  }
  std::string why;
  if (tracker_.Answer(ts, sender, &why, refused)) {
    FinishRequest(ts, state);
  } else if (!why.empty()) {
    post_->CountDropped(sender, why);
  }
}

Status KVWorkerCore::Impl::RefusalOf(const Message& msg) const {
  const pb::Control& ctrl = msg.meta.control();
  if (ctrl.error().empty()) return Status::OK();
  int code = ctrl.error_code();
  if (code <= Status::kOk || code > Status::kCorruption) {
    code = Status::kInternal;
  }
  return Status(static_cast<Status::Code>(code),
                post_->DescribeNode(msg.meta.sender()) +
                    " refused the request: " + ctrl.error());
}

StatusOr<RawKVPairs> KVWorkerCore::Impl::DecodeAnswer(Message* msg,
                                                      const PullState& state,
                                                      int rank) const {
  Status st = filters_.Decode(msg);
  if (!st.ok()) return st;
  if (!msg->meta.keys_asked()) {
    return DecodeKVPairs(*msg, true, val_type_, val_size_);
  }
  SArray<Key> asked;
  st = state.AskedOf(rank, &asked);
  if (!st.ok()) return st;
  return DecodeKVPairs(*msg, true, val_type_, val_size_, &asked);
}

void KVWorkerCore::Impl::FinishRequest(
    int ts, const std::shared_ptr<PullState>& state) {
  Status st;
  if (state) st = state->Assemble();
  tracker_.Finish(ts, st);
}

Status KVWorkerCore::Impl::Wait(int ts) {
  auto state = std::static_pointer_cast<PullState>(tracker_.Payload(ts));
  Status st = tracker_.Wait(ts, post_->config().request_timeout_ms);
  if (state) state->Abandon();  // after a running copy
  return st;
}

void KVWorkerCore::Impl::OnFailure(int id, const Status& why) {
  if (id >= 0 && post_->config().replicas > 0 && post_->TakenOver(id)) {
    return FailOver(routes_.Cover(id));
  }
  // id < 0: no one server (the node stops): every request fails.
  std::vector<int> slots =
      id >= 0 ? routes_.Lose(id, why) : std::vector<int>{id};
  for (int slot : slots) tracker_.FailServer(slot, why);
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
