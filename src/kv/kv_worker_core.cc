// KVWorkerCore: the worker's push/pull path. Each hop is one function:
//   Request -> CheckKVPairs -> SliceKVPairs -> SendSlices (AddKVFrames,
//   Postoffice::Send) ... OnResponse (DecodeKVPairs, StorePullAnswer,
//   RequestTracker::Answer) -> FinishRequest (AssemblePull or Adopt, Finish).
// A pull into a ps::SharedArray asks a co-located server to write its answer
// in place (ReplyInto); StorePullAnswer then finds it already there. A
// server may refuse a request (an answer with control.error and no frames):
// the request then ends with that error, naming the server.
// A user slicer (SetSlicer) takes a simpler path: SliceByUser checks its
// slices, and the pulled values are assembled key by key (AssembleByKey),
// since its slices need not be contiguous runs of the request's keys.
// Resending (PS_RESEND_TIMEOUT_MS): each slice is kept until its server
// answers (KeepForResend, before it is sent); Resend (on the monitor
// thread's tick) builds its message again and sends it when due, and
// OnResponse lets go of a second answer (Answered). The server
// applies a request once (KVServerCore's Seen). Replication (PS_REPLICAS):
// when a server dies and its replica takes over (FailOver), its slices go
// to the replica naming the dead server's rank (Meta.shard), what it left
// unanswered among them.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "kv/call_gate.h"
#include "kv/request_tracker.h"
#include "kv/slicer.h"
#include "postoffice/postoffice.h"
#include "ps/kv_core.h"
#include "ps/node.h"
#include "van/shm.h"
#include "van/sync.h"

namespace ps {
namespace detail {

namespace {

// A pull in flight: where answers go and what was asked. The payload of its
// tracker entry.
// The first four are set before the request's tracker entry exists and
// stay as they are; mu guards the rest, and the sink's destination, against
// Wait().
struct PullState {
  PullSink sink;
  SArray<Key> keys;         // the request's keys
  std::vector<size_t> cut;  // keys[cut[s], cut[s+1]) went to server s
  // Non-empty: server s's answer goes to sink.direct + place[s], as it
  // comes, while it is place[s + 1] - place[s] bytes. Certain when one
  // server holds every key; otherwise guessed from the sizes (the values per
  // key taken as uniform when they divide evenly), and an answer of another
  // size sets `misplaced`.
  std::vector<size_t> place;
  // Set by a user slicer: the keys sent to server s are asked[s] (cut is
  // then empty), and answers are assembled key by key.
  bool by_key = false;
  std::vector<SArray<Key>> asked;

  Mutex mu;
  bool abandoned GUARDED_BY(mu) = false;  // done; never touch the sink again
  // An answer broke `place`: assemble at the end.
  bool misplaced GUARDED_BY(mu) = false;
  // By server rank (all kept, zero-copy).
  std::map<int, RawKVPairs> answers GUARDED_BY(mu);
  Status error GUARDED_BY(mu);
};

}  // namespace

class KVWorkerCore::Impl {
 public:
  Impl(Node* node, int app_id, int customer_id, int val_type, size_t val_size)
      : post_(node->postoffice()),
        app_id_(app_id),
        customer_id_(customer_id),
        val_type_(val_type),
        val_size_(val_size),
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
      const int n = node->num_servers();
      for (int id : post_->GetNodeIds(kServerGroup)) {
        if (!post_->TakenOver(id)) continue;
        MutexLock lock(&mu_);
        route_[id] = ServerRankToId(ReplicaOf(IdToRank(id), n));
      }
    }
  }
  ~Impl() {
    post_->UnregisterCustomer(false, app_id_, customer_id_);
    gate_->Close();
  }

  int Request(bool push, bool pull, int cmd, const RawKVPairs& kvs,
              PullSink sink, std::function<void()> callback);
  Status Wait(int ts);
  size_t num_pending() const { return tracker_.num_pending(); }
  Placement placement_;
  RawSlicer slicer_;  // null: slice by placement_

 private:
  std::vector<int> TouchedServers(const std::vector<KVSlice>& slices,
                                  Status* dead) EXCLUDES(mu_);
  // Runs the user slicer on `kvs` and checks its slices: one per server,
  // each a valid KV list, and (for a pull) every key sent somewhere.
  Status SliceByUser(const RawKVPairs& kvs, bool push, bool pull,
                     std::vector<KVSlice>* slices) const;
  void SendSlices(int ts, bool push, bool pull, int cmd,
                  std::vector<KVSlice>* slices, const PullState* state);
  // The message of request ts for server `slot`'s keys, to whoever serves
  // them now (its replica, once it died).
  Message SliceMessage(int ts, int slot, bool push, bool pull, int cmd,
                       const RawKVPairs& kvs);
  // Where each server's answer goes in a direct pull destination of `bytes`
  // (PullState::place); empty when that is not known in advance.
  std::vector<size_t> DirectPlaces(const std::vector<size_t>& cut,
                                   size_t num_touched, size_t bytes) const;
  // Server `rank`'s part of a direct pull destination, if in shared memory.
  static bool ReplyInto(const PullState& state, size_t rank,
                        pb::SharedRef* ref);
  void OnResponse(Message&& msg);
  // The error a server answered with instead of data (OK for data).
  Status RefusalOf(const Message& msg) const;
  Status StorePullAnswer(PullState* state, int rank, RawKVPairs answer)
      EXCLUDES(state->mu);
  void FinishRequest(int ts, const std::shared_ptr<PullState>& state);
  Status AssemblePull(PullState* state) EXCLUDES(state->mu);
  // The values of state->keys, in their order, from answers holding them
  // in any order (the lowest rank's answer for a key sent to several).
  Status AssembleByKey(PullState* state) REQUIRES(state->mu);
  // Hands a lone answer's frames to the sink as they are (no copy); false
  // when the sink or the answer does not allow it.
  bool Adopt(PullState* state) REQUIRES(state->mu);
  void OnFailure(int id, const Status& why);
  // A slice of a request, kept until its server answers: enough to send
  // it again.
  struct Unanswered {
    int ts;
    int slot;  // the server whose keys it asks for
    bool push;
    bool pull;
    int cmd;
    RawKVPairs kvs;
    Postoffice::Clock::time_point due;  // of the next resend
    int sends = 1;
  };
  // Keeps a slice (before it is sent: the answer may come first).
  void KeepForResend(Unanswered&& u) EXCLUDES(resend_mu_);
  // Sends kept slices again (counted as resent). Their frames are the
  // caller's arrays, not copies: unchanged until the slice is answered
  // (the caller waits). A resend ZeroMQ still sends once the answer came
  // may carry bytes written since; the server, which applied the request,
  // lets it go without reading its values (KVServerCore's Seen).
  void SendAgain(const std::vector<Unanswered>& slices);
  // Replication: the node that serves server `slot`'s keys (its replica,
  // once it died), and the switch to the replica.
  int RouteOf(int slot) EXCLUDES(mu_);
  void FailOver(int id) EXCLUDES(mu_, resend_mu_);
  // Sends again what is due and unanswered; forgets what needs no answer
  // any more (done, failed, timed out).
  void Resend(Postoffice::Clock::time_point now) EXCLUDES(resend_mu_);
  // Whether server's answer to ts was awaited, came already (a second
  // answer: let go), or was never asked for (the tracker says why).
  enum class Answer { kAwaited, kDuplicate, kUnknown };
  Answer Answered(int ts, int server) EXCLUDES(resend_mu_);

  Postoffice* const post_;
  const int app_id_;
  const int customer_id_;
  const int val_type_;
  const size_t val_size_;
  const std::shared_ptr<CallGate> gate_ = std::make_shared<CallGate>();
  RequestTracker tracker_;
  Mutex mu_;
  std::map<int, Status> dead_ GUARDED_BY(mu_);  // node id -> why
  // Dead servers taken over: server id -> its replica's id.
  std::map<int, int> route_ GUARDED_BY(mu_);

  const int resend_ms_ = post_->config().resend_timeout_ms;  // 0: never
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
    if (slicer_) {
      state->by_key = true;
      for (const KVSlice& slice : slices)
        state->asked.push_back(slice.kvs.keys);
    } else {
      state->cut = placement_.Slice(kvs.keys.data(), kvs.keys.size());
    }
    if (state->sink.direct != nullptr && !state->sink.alloc_lens &&
        !state->by_key) {
      state->place =
          DirectPlaces(state->cut, servers.size(), state->sink.direct_bytes);
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
  if (servers.empty() && state) AssemblePull(state.get()).IgnoreError();
  std::weak_ptr<PullState> weak_state = state;
  int ts = tracker_.Start(
      servers,
      [kvs, weak_state, callback = std::move(callback)] {
        if (auto s = weak_state.lock()) {
          MutexLock lock(&s->mu);  // waits out a late copy
          s->abandoned = true;
        }
        if (callback) callback();
      },
      forget, state);
  SendSlices(ts, push, pull, cmd, &slices, state.get());
  return ts;
}

std::vector<int> KVWorkerCore::Impl::TouchedServers(
    const std::vector<KVSlice>& slices, Status* dead) {
  std::vector<int> servers;
  MutexLock lock(&mu_);
  for (size_t s = 0; s < slices.size(); ++s) {
    if (!slices[s].touched) continue;
    int id = ServerRankToId(static_cast<int>(s));
    auto it = dead_.find(id);
    if (it != dead_.end()) *dead = it->second;
    servers.push_back(id);
  }
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

std::vector<size_t> KVWorkerCore::Impl::DirectPlaces(
    const std::vector<size_t>& cut, size_t num_touched, size_t bytes) const {
  const size_t n = cut.back();
  std::vector<size_t> place(cut.size());
  if (n > 0 && bytes % (n * val_size_) == 0) {
    for (size_t s = 0; s < cut.size(); ++s) place[s] = cut[s] * (bytes / n);
  } else if (num_touched == 1) {
    for (size_t s = 0; s < cut.size(); ++s) place[s] = cut[s] == n ? bytes : 0;
  } else {
    place.clear();
  }
  return place;
}

bool KVWorkerCore::Impl::ReplyInto(const PullState& state, size_t rank,
                                   pb::SharedRef* ref) {
  if (state.place.empty()) return false;
  const size_t bytes = state.place[rank + 1] - state.place[rank];
  if (!SharedMemory::Get().Find(state.sink.direct + state.place[rank], bytes,
                                ref)) {
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
    Message msg = SliceMessage(ts, slot, push, pull, cmd, slice.kvs);
    pb::SharedRef into;
    if (state != nullptr && ReplyInto(*state, s, &into)) {
      // The van drops it for remote servers; a resend goes without it.
      *msg.meta.mutable_reply_into() = into;
    }
    if (resend_ms_ > 0) {
      KeepForResend({ts, slot, push, pull, cmd, std::move(slice.kvs), due});
    }
    Status st = post_->Send(&msg);
    if (!st.ok()) tracker_.FailServer(slot, st);
  }
}

Message KVWorkerCore::Impl::SliceMessage(int ts, int slot, bool push, bool pull,
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
  const int to = RouteOf(slot);
  m.set_recver(to);
  if (to != slot) m.set_shard(IdToRank(slot));  // taken over
  AddKVFrames(kvs, push, val_type_, &msg);
  return msg;
}

void KVWorkerCore::Impl::KeepForResend(Unanswered&& u) {
  MutexLock lock(&resend_mu_);
  unanswered_.push_back(std::move(u));
}

void KVWorkerCore::Impl::SendAgain(const std::vector<Unanswered>& slices) {
  for (const Unanswered& u : slices) {
    Message msg = SliceMessage(u.ts, u.slot, u.push, u.pull, u.cmd, u.kvs);
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

int KVWorkerCore::Impl::RouteOf(int slot) {
  MutexLock lock(&mu_);
  auto it = route_.find(slot);
  return it == route_.end() ? slot : it->second;
}

void KVWorkerCore::Impl::FailOver(int id) {
  const int rank = IdToRank(id);
  const int to = ServerRankToId(ReplicaOf(rank, post_->config().num_servers));
  {
    MutexLock lock(&mu_);
    route_[id] = to;
  }
  LOG(WARNING) << "requests for " << post_->DescribeNode(id) << " go to "
               << post_->DescribeNode(to) << ", its replica";
  // What the dead server left unanswered goes to the replica now.
  std::vector<Unanswered> again;
  {
    MutexLock lock(&resend_mu_);
    auto due = Postoffice::Clock::now() + std::chrono::milliseconds(resend_ms_);
    for (Unanswered& u : unanswered_) {
      if (u.slot != id) continue;
      u.due = due;
      again.push_back(u);
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
    if (RouteOf(slot) != sender) {
      post_->CountDropped(sender, "an answer for server " +
                                      std::to_string(msg.meta.shard()) +
                                      "'s keys, which it does not serve");
      return;
    }
    sender = slot;
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
    MutexLock lock(&state->mu);
    if (state->error.ok()) state->error = refused;
  } else if (state) {
    StatusOr<RawKVPairs> kvs = DecodeKVPairs(msg, true, val_type_, val_size_);
    Status st = kvs.ok() ? StorePullAnswer(state.get(), IdToRank(sender),
                                           std::move(kvs).value())
                         : kvs.status();
    if (!st.ok()) {
      post_->CountDropped(sender, "bad pull answer: " + st.message());
      MutexLock lock(&state->mu);
      if (state->error.ok()) {
        state->error = Status::Corruption(post_->DescribeNode(sender) +
                                          " answered badly: " + st.message());
      }
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

Status KVWorkerCore::Impl::StorePullAnswer(PullState* state, int rank,
                                           RawKVPairs answer) {
  SArray<Key> asked;
  if (state->by_key) {
    if (rank < 0 || static_cast<size_t>(rank) >= state->asked.size()) {
      return Status::Corruption("no such server rank " + std::to_string(rank));
    }
    asked = state->asked[rank];
  } else {
    if (rank < 0 || static_cast<size_t>(rank) + 1 >= state->cut.size()) {
      return Status::Corruption("no such server rank " + std::to_string(rank));
    }
    asked = state->keys.segment(state->cut[rank], state->cut[rank + 1]);
  }
  if (answer.keys.size() != asked.size() ||
      std::memcmp(answer.keys.data(), asked.data(),
                  asked.size() * sizeof(Key)) != 0) {
    return Status::Corruption("answered " + std::to_string(answer.keys.size()) +
                              " keys that differ from the " +
                              std::to_string(asked.size()) + " asked");
  }
  MutexLock lock(&state->mu);
  if (state->abandoned) return Status::OK();
  if (!state->place.empty() && !state->misplaced) {
    size_t want = state->place[rank + 1] - state->place[rank];
    char* dst = state->sink.direct + state->place[rank];
    if (answer.vals.size() == want) {
      // A co-located server may have written it in place (ReplyInto).
      if (answer.vals.data() != dst) {
        std::memcpy(dst, answer.vals.data(), want);
      }
    } else {
      state->misplaced = true;  // e.g. lens that happen to divide evenly
    }
  }
  state->answers[rank] = std::move(answer);
  return Status::OK();
}

void KVWorkerCore::Impl::FinishRequest(
    int ts, const std::shared_ptr<PullState>& state) {
  Status st;
  if (state) st = AssemblePull(state.get());
  tracker_.Finish(ts, st);
}

Status KVWorkerCore::Impl::AssemblePull(PullState* state) {
  MutexLock lock(&state->mu);
  if (state->abandoned || !state->error.ok()) return state->error;
  if (!state->place.empty() && !state->misplaced) {
    state->answers.clear();
    return Status::OK();
  }
  if (state->by_key) return AssembleByKey(state);
  if (Adopt(state)) return Status::OK();
  // A co-located server may have written its answer into the destination at
  // a place guessed from the sizes (ReplyInto), where another answer
  // belongs: take such answers out of the way first.
  const char* begin = state->sink.direct;
  const char* end = begin + state->sink.direct_bytes;
  for (auto& [rank, a] : state->answers) {
    if (begin != nullptr && a.vals.data() < end &&
        a.vals.data() + a.vals.size() > begin) {
      SArray<char> copy;
      copy.CopyFrom(a.vals);
      a.vals = copy;
    }
  }
  size_t total = 0, keys = 0;
  for (const auto& [rank, a] : state->answers) {
    total += a.vals.size();
    keys += a.keys.size();
  }
  char* dst = state->sink.alloc_vals(total);
  int* lens = state->sink.alloc_lens ? state->sink.alloc_lens(keys) : nullptr;
  for (const auto& [rank, a] : state->answers) {
    if (!a.vals.empty()) std::memcpy(dst, a.vals.data(), a.vals.size());
    dst += a.vals.size();
    if (lens == nullptr) continue;
    size_t n = a.keys.size();
    for (size_t i = 0; i < n; ++i) {
      *lens++ = !a.lens.empty()
                    ? a.lens[i]
                    : static_cast<int>(a.vals.size() / val_size_ / n);
    }
  }
  state->answers.clear();
  return Status::OK();
}

Status KVWorkerCore::Impl::AssembleByKey(PullState* state) {
  struct Part {
    const char* vals;
    size_t bytes;
  };
  std::unordered_map<Key, Part> parts;
  for (const auto& [rank, a] : state->answers) {  // ascending rank
    size_t n = a.keys.size();
    size_t uniform = n == 0 ? 0 : a.vals.size() / n;
    const char* at = a.vals.data();
    for (size_t i = 0; i < n; ++i) {
      size_t bytes =
          a.lens.empty() ? uniform : static_cast<size_t>(a.lens[i]) * val_size_;
      parts.emplace(a.keys[i], Part{at, bytes});
      at += bytes;
    }
  }
  size_t total = 0;
  for (Key key : state->keys) {
    auto it = parts.find(key);
    if (it == parts.end()) {
      return Status::Corruption("no server answered pulled key " +
                                std::to_string(key));
    }
    total += it->second.bytes;
  }
  // The destination may be presized: `parts` points into the answers only.
  char* dst = state->sink.alloc_vals(total);
  int* lens = state->sink.alloc_lens
                  ? state->sink.alloc_lens(state->keys.size())
                  : nullptr;
  for (Key key : state->keys) {
    const Part& part = parts[key];
    if (part.bytes > 0) std::memcpy(dst, part.vals, part.bytes);
    dst += part.bytes;
    if (lens != nullptr) *lens++ = static_cast<int>(part.bytes / val_size_);
  }
  state->answers.clear();
  return Status::OK();
}

bool KVWorkerCore::Impl::Adopt(PullState* state) {
  if (!state->sink.adopt || state->answers.size() != 1) return false;
  const RawKVPairs& a = state->answers.begin()->second;
  // Frames arrive aligned for their element type (the codec realigns the
  // rare one ZeroMQ left at an odd offset), so they can be handed over.
  if (state->sink.alloc_lens && a.lens.empty()) return false;
  state->sink.adopt(a.vals, a.lens);
  state->answers.clear();
  return true;
}

Status KVWorkerCore::Impl::Wait(int ts) {
  auto state = std::static_pointer_cast<PullState>(tracker_.Payload(ts));
  Status st = tracker_.Wait(ts, post_->config().request_timeout_ms);
  if (state) {
    MutexLock lock(&state->mu);  // waits out a running copy
    state->abandoned = true;
  }
  return st;
}

void KVWorkerCore::Impl::OnFailure(int id, const Status& why) {
  if (id >= 0 && post_->config().replicas > 0 && post_->TakenOver(id)) {
    return FailOver(id);
  }
  std::vector<int> slots = {id};
  if (id >= 0) {
    MutexLock lock(&mu_);
    dead_[id] = why;
    // The keys it had taken over are lost with it.
    for (const auto& [slot, to] : route_) {
      if (to == id) {
        dead_[slot] = why;
        slots.push_back(slot);
      }
    }
  }
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
size_t KVWorkerCore::num_pending() const { return impl_->num_pending(); }
void KVWorkerCore::SetPlacement(Placement placement) {
  CHECK(placement.valid());
  impl_->placement_ = std::move(placement);
}
const Placement& KVWorkerCore::placement() const { return impl_->placement_; }
void KVWorkerCore::SetSlicer(RawSlicer slicer) {
  impl_->slicer_ = std::move(slicer);
}

}  // namespace detail
}  // namespace ps
