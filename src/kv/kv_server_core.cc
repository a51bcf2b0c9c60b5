// KVServerCore: the server's path, one function a stage:
//   OnRequest: receive (MayAsk, the shard) -> dedup (RequestDedup::Seen) ->
//   filters + decode (Unpack: FilterChain::Decode, DecodeKVPairs) ->
//   handle (Handle: the user's handle, which answers) ->
//   Response: answer (AnswerTo) -> encode (AddKVFrames) -> filters
//   (FilterChain::Encode) -> send (Postoffice::Send);
// or ResponseError (an answer with control.error and no frames). With
// resending on (PS_RESEND_TIMEOUT_MS), a request that comes again is
// applied once: dropped while its answer is pending; once answered,
// answered again without applying its values (Repeat).
// With replicas (PS_REPLICAS=1), a push to this server's own keys reaches
// its replica one of two ways, and its answer waits for the replica's
// answer to it (ReplicaHold, src/kv/replica_takeover.h: Hold,
// OnReplicaAnswer; released on the replica's death by OnFailure):
//   copied on its own, as the worker's (Forward), before the handle runs;
//   or, for the pushes the handle replicates by step (SetReplicaSteps: a
//   BSP DenseShard), not at all: the handle sends the replica the step's
//   effect once, as this server's own push (ReplicateStep), naming the
//   pushes it stands for.
// Requests for the keys this server holds for its primary go to the
// replica handle (Handle); a primary's forwards are dropped once this
// server took its keys over (fenced: it was declared dead and is back).
// Ownership: a
// request's received frames belong to its handle, which may write into
// them (DenseShard sums into them); the copy for the replica owns its bytes.
// With restarts (PS_MAX_RESTARTS): when a dead worker's successor rejoins
// (OnJoin), the old process's requests are forgotten (its held answers
// too), and an answer to one of them is dropped rather than sent to the
// successor (Incarnation).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kv/call_gate.h"
#include "kv/dedup.h"
#include "kv/filter_chain.h"
#include "kv/replica_takeover.h"
#include "kv/request_internals.h"
#include "kv/slicer.h"
#include "postoffice/postoffice.h"
#include "postoffice/replica_chain.h"
#include "ps/kv_core.h"
#include "ps/node.h"
#include "van/shm.h"
#include "van/sync.h"

namespace ps {
namespace detail {

namespace {

const char* TypeName(int type) {
  static const char* const kNames[] = {"char",   "int8",  "uint8",  "int16",
                                       "uint16", "int32", "uint32", "int64",
                                       "uint64", "float", "double"};
  if (type < 0 || type > kTypeDouble) return "unknown";
  return kNames[type];
}

}  // namespace

class KVServerCore::Impl {
 public:
  using Done = RequestDedup::Done;

  Impl(Node* node, int app_id, int val_type, size_t val_size)
      : post_(node->postoffice()),
        node_(node),
        app_id_(app_id),
        val_type_(val_type),
        val_size_(val_size),
        hold_(
            post_->config().replicas, post_->config().num_servers,
            [post = post_] { return post->rank(); },
            [post = post_](int id) { return post->routes()->IsDown(id); }) {}
  Node* node() const { return node_; }
  ~Impl() {
    ClearHandle(false);
    ClearHandle(true);
  }

  void SetHandle(RawHandle handle, bool replica) {
    if (replica) {
      CHECK(!registered_) << "set_replica_handle after set_request_handle";
      MutexLock lock(&replica_mu_);
      CHECK(!replica_handle_) << "set_replica_handle called twice";
      replica_handle_ = std::move(handle);
      return;
    }
    CHECK(!registered_) << "set_request_handle called twice";
    handle_ = std::move(handle);
    registered_ = true;
    gate_ = std::make_shared<CallGate>();
    post_->RegisterCustomer(
        true, app_id_, -1, [this](Message&& msg) { OnRequest(std::move(msg)); },
        [this, gate = gate_](const core::PeerEvent& e) {
          gate->Call([&] {
            if (e.kind == core::PeerEvent::kPeerRejoined) {
              OnJoin(e.id);
            } else {
              OnFailure(e.id, e.Told());
            }
          });
        });
  }

  void ClearHandle(bool replica) {
    if (replica) {
      {
        MutexLock lock(&replica_mu_);  // waits out a running replica handle
        replica_handle_ = nullptr;
      }
      MutexLock lock(&failure_mu_);
      replica_failure_handle_ = nullptr;
      return;
    }
    if (!registered_) return;
    post_->UnregisterCustomer(true, app_id_, -1);  // waits out a handler
    gate_->Close();                                // and a failure handler
    registered_ = false;  // handle_ stays: it may be the caller
    MutexLock lock(&failure_mu_);
    failure_handle_ = nullptr;
  }

  bool SetReplicaSteps(std::function<bool(const KVMeta&)> stepped) {
    CHECK(!registered_) << "set_replica_steps after set_request_handle";
    if (replicas_ == 0) return false;
    stepped_ = std::move(stepped);
    return true;
  }

  // The handle's step forward (SetReplicaSteps): `kvs` under `cmd` goes to
  // the replica as this server's own push (origin: this server, timestamp:
  // a ticket of its own, priority: `priority`), and the answers to `covers`
  // wait for the replica's answer to it.
  bool ReplicateStep(int cmd, int priority, const RawKVPairs& kvs,
                     const std::vector<KVMeta>& covers) {
    if (!stepped_ || !hold_.Forwards()) return false;
    Message forward;
    pb::Meta& m = forward.meta;
    m.set_app_id(app_id_);
    m.set_customer_id(0);
    m.set_timestamp(next_ticket_.fetch_add(1));
    m.set_request(true);
    m.set_push(true);
    m.set_head(cmd);
    m.set_recver(hold_.replica_id());
    m.set_shard(post_->rank());
    m.set_origin(post_->id());
    RawKVPairs frames = kvs;
    frames.priority = priority;
    AddKVFrames(frames, true, val_type_, &forward);
    hold_.ForwardedStep(forward, covers);
    SendCopy(&forward);
    post_->metrics().ReplicaForwarded();
    return true;
  }

  void SetFailureHandle(FailureHandle handle, bool replica) {
    MutexLock lock(&failure_mu_);
    (replica ? replica_failure_handle_ : failure_handle_) = std::move(handle);
  }

  void OnFailure(int id, const Status& why) {
    // The replica died: nothing more to wait for.
    for (Message& answer : hold_.OnFailure(id)) Send(&answer);
    FailureHandle handle, replica_handle;
    {
      MutexLock lock(&failure_mu_);
      handle = failure_handle_;
      replica_handle = replica_failure_handle_;
    }
    if (handle) handle(id, why);
    if (replica_handle) replica_handle(id, why);
  }

  // Worker `id` was restarted: what this server remembers of the old
  // process's requests is no longer about the process behind that id.
  void OnJoin(int id) {
    dedup_.Forget(id);
    hold_.ForgetWorker(id);
    MutexLock lock(&incarnation_mu_);
    ++incarnation_[id];
  }

  // How many times worker `id` rejoined; stamped on each request of it.
  int Incarnation(int id) EXCLUDES(incarnation_mu_) {
    MutexLock lock(&incarnation_mu_);
    auto it = incarnation_.find(id);
    return it == incarnation_.end() ? 0 : it->second;
  }

  // Whether req came from an earlier process of its worker than the one
  // now behind its id: its answer would reach the wrong process.
  bool Outlived(const KVMeta& req) {
    if (!restarts_ ||
        RequestInternals::Of(req).incarnation == Incarnation(req.sender)) {
      return false;
    }
    LOG(INFO) << "not answering a request of the process "
              << post_->DescribeNode(req.sender) << " replaced";
    return true;
  }

  void OnRequest(Message&& msg) {
    const pb::Meta& m = msg.meta;
    if (!MayAsk(m)) {
      post_->CountDropped(m.sender(),
                          "a server takes requests from workers "
                          "and its replica chain only: " +
                              DebugString(msg));
      return;
    }
    // A primary whose keys this server took over is fenced: it was declared
    // dead (frozen or cut off, then back), and what it forwards is of a
    // placement that is no more.
    if (m.request() && m.has_origin() && post_->TakenOver(m.sender())) {
      post_->CountDropped(m.sender(),
                          "a forward of a primary whose keys this server "
                          "took over (fenced): " +
                              DebugString(msg));
      return;
    }
    // The only answers a server gets: its replica's.
    if (!m.request()) return OnReplicaAnswer(m);
    KVMeta meta = RequestMeta(m);
    const int me = post_->rank();
    const bool for_replica = meta.shard >= 0 && meta.shard != me;
    if (for_replica &&
        (replicas_ == 0 ||
         meta.shard != PrimaryOf(me, post_->config().num_servers))) {
      ResponseError(meta,
                    Status::InvalidArgument("server " + std::to_string(me) +
                                            " holds no keys of server " +
                                            std::to_string(meta.shard)));
      return;
    }
    const bool forward = !for_replica && m.push() && hold_.Forwards();
    // A push the handle replicates by step gets no copy of its own.
    const bool stepped = forward && stepped_ && stepped_(meta);
    Status refusal;
    const Done done = dedup_on_ ? dedup_.Seen(meta, &refusal) : Done::kNew;
    // What is left to do without the request's frames.
    const bool awaits = done != Done::kNew && forward && hold_.Awaits(meta);
    if (done != Done::kNew) {
      post_->CountDuplicate();
      if (done == Done::kRefused) return ResponseError(meta, refusal);
      if (done == Done::kPending && !awaits) return;
      if (done == Done::kAnswered && !m.pull() && !awaits) {
        return Response(meta, RawKVPairs());
      }
    }
    StatusOr<RawKVPairs> kvs = Unpack(&msg);
    if (!kvs.ok()) {
      post_->CountDropped(m.sender(), "bad request: " + kvs.status().message());
      if (done == Done::kNew && dedup_on_) dedup_.Unsee(meta);
      return ResponseError(meta, kvs.status());
    }
    if (m.pull()) {
      RequestInternals::Change(
          &meta, [&](RequestInternals* in) { in->asked_keys = kvs->keys; });
    }
    if (done != Done::kNew)
      return Repeat(meta, done, awaits && !stepped, awaits && stepped,
                    for_replica, &*kvs);
    // A region made for this request alone (SharedRef.once) is mapped
    // copy-on-write: the handle's own, as received bytes are.
    meta.vals_borrowed =
        std::any_of(m.shared().begin(), m.shared().end(),
                    [](const pb::SharedRef& ref) { return !ref.once(); });
    if (m.has_reply_into()) {
      RequestInternals::Change(&meta, [&](RequestInternals* in) {
        in->reply_into = std::make_shared<pb::SharedRef>(m.reply_into());
      });
    }
    // From here on the received frames are the handle's: it may keep them
    // and write into them (KVMeta::vals_borrowed says when it may not), so
    // nothing else reads them after it got them; the replica's copy has
    // bytes of its own.
    if (forward && !stepped) {
      Forward(meta, *kvs);
      post_->metrics().ReplicaForwarded();  // once: not again on a resend
    }
    Handle(meta, *kvs, for_replica);
  }

  // The filters stage, then the decode stage, of a request.
  StatusOr<RawKVPairs> Unpack(Message* msg) const {
    Status st = filters_.Decode(msg);
    if (!st.ok()) return st;
    const pb::Meta& m = msg->meta;
    StatusOr<RawKVPairs> kvs =
        DecodeKVPairs(*msg, m.push(), val_type_, val_size_);
    if (kvs.ok()) return kvs;
    if (m.push() && m.data_type_size() >= 2 && m.data_type(1) != val_type_) {
      return Status::InvalidArgument(
          std::string("server serves ") + TypeName(val_type_) +
          " values; the request has " + TypeName(m.data_type(1)));
    }
    return Status::InvalidArgument(kvs.status().message());
  }

  // A request that came again (resent) and was seen (`done`): its values
  // are never applied again. Its answer may wait for the replica, whose
  // copy (or answer) may be what was lost: the message it waits for goes
  // again: its copy (`copy_awaits`), with the values of the first (their
  // worker, not answered yet, has not written them since), or the step
  // forward it was summed into (`step_awaits`). An answered pull is served
  // again without its push.
  void Repeat(KVMeta meta, Done done, bool copy_awaits, bool step_awaits,
              bool for_replica, RawKVPairs* kvs) {
    if (copy_awaits) {
      post_->CountResent();
      Forward(meta, *kvs);
    }
    std::optional<Message> step;
    if (step_awaits) step = hold_.StepOf(meta);
    if (step) {
      post_->CountResent();
      SendCopy(&*step);
    }
    if (done == Done::kPending) return;
    if (!meta.pull) return Response(meta, RawKVPairs());
    meta.push = false;
    kvs->vals = SArray<char>();
    kvs->lens = SArray<int>();
    Handle(meta, *kvs, for_replica);
  }

  Status AddFilter(std::shared_ptr<Filter> filter) {
    CHECK(!registered_) << "KVServer::AddFilter after set_request_handle";
    return filters_.Add(std::move(filter));
  }

  void Response(const KVMeta& req, const RawKVPairs& res) {
    if (Outlived(req)) return;
    if (dedup_on_) dedup_.MarkAnswered(req, Status::OK());
    Message msg = AnswerTo(req);
    if (req.pull) {
      const RequestInternals& in = RequestInternals::Of(req);
      // The keys as asked (the request's own array) need not go back; a
      // filter may rewrite frames, so with filters every frame goes.
      const bool keys_asked = filters_.empty() && !res.keys.empty() &&
                              res.keys.data() == in.asked_keys.data() &&
                              res.keys.size() == in.asked_keys.size();
      RawKVPairs out = WriteInPlace(req, res);
      if (in.share_answer) out = ShareLarge(msg.meta.recver(), std::move(out));
      AddKVFrames(out, true, val_type_, &msg, keys_asked);
    }
    Status st = filters_.Encode(&msg);
    if (!st.ok()) return ResponseError(req, st);
    if (hold_.Hold(req, &msg)) return;
    st = post_->Send(&msg);
    if (st.code() == Status::kInvalidArgument) {
      // Too large to send (PS_MAX_MESSAGE_BYTES): the worker learns why
      // instead of waiting for an answer that never comes.
      ResponseError(req, st);
    } else if (!st.ok()) {
      LOG(WARNING) << "answer to " << post_->DescribeNode(msg.meta.recver())
                   << " not sent: " << st;
    }
  }

  void ResponseError(const KVMeta& req, const Status& error) {
    CHECK(!error.ok()) << "ResponseError with OK";
    if (Outlived(req)) return;
    if (dedup_on_) dedup_.MarkAnswered(req, error);
    hold_.Refused(req);
    Message msg = AnswerTo(req);
    msg.meta.mutable_control()->set_error(
        error.message().empty() ? "(no reason given)" : error.message());
    msg.meta.mutable_control()->set_error_code(error.code());
    Send(&msg);
  }

 private:
  // Who may ask: a worker; and (`origin` set: on a worker's behalf, or on
  // the primary's own for a step forward) this server's primary,
  // forwarding, or its replica, answering.
  bool MayAsk(const pb::Meta& m) const {
    if (!m.has_origin()) return m.request() && IsWorkerId(m.sender());
    const int primary = m.request() ? m.sender() : post_->id();
    return replicas_ > 0 && IsServerId(m.sender()) &&
           (IsWorkerId(m.origin()) || m.origin() == primary) &&
           IsReplicaTraffic(m.request(), IdToRank(m.sender()), post_->rank(),
                            post_->config().num_servers);
  }

  KVMeta RequestMeta(const pb::Meta& m) EXCLUDES(incarnation_mu_) {
    KVMeta meta;
    meta.cmd = m.head();
    meta.push = m.push();
    meta.pull = m.pull();
    // A push forwarded by a primary is the worker's (MayAsk checked that it
    // comes from the server this one is the replica of).
    meta.sender = m.has_origin() ? m.origin() : m.sender();
    meta.shard = m.has_shard() ? m.shard() : -1;
    meta.timestamp = m.timestamp();
    meta.customer_id = m.customer_id();
    meta.app_id = m.app_id();
    meta.priority = m.priority();
    const int incarnation = restarts_ ? Incarnation(meta.sender) : 0;
    // A worker's request to a job without restarts answers as the defaults
    // say: no internals of its own to make.
    if (m.has_origin() || m.share_answer() || incarnation != 0) {
      RequestInternals::Change(&meta, [&](RequestInternals* in) {
        in->reply_to = m.has_origin() ? m.sender() : -1;
        in->share_answer = m.share_answer();
        in->incarnation = incarnation;
      });
    }
    return meta;
  }

  static Message AnswerTo(const KVMeta& req) {
    Message msg;
    pb::Meta& m = msg.meta;
    m.set_app_id(req.app_id);
    m.set_customer_id(req.customer_id);
    m.set_timestamp(req.timestamp);
    m.set_request(false);
    m.set_push(req.push);
    m.set_pull(req.pull);
    m.set_head(req.cmd);
    const int reply_to = RequestInternals::Of(req).reply_to;
    m.set_recver(reply_to >= 0 ? reply_to : req.sender);
    if (req.shard >= 0) m.set_shard(req.shard);
    if (reply_to >= 0) m.set_origin(req.sender);
    return msg;
  }

  void Send(Message* msg) {
    Status st = post_->Send(msg);
    if (!st.ok()) {
      LOG(WARNING) << "answer to " << post_->DescribeNode(msg->meta.recver())
                   << " not sent: " << st;
    }
  }

  // Runs the handle of this server's own keys, or of the keys it holds for
  // its primary (for_replica).
  void Handle(const KVMeta& meta, const RawKVPairs& kvs, bool for_replica) {
    if (!for_replica) return handle_(meta, kvs);
    MutexLock lock(&replica_mu_);
    if (!replica_handle_) {
      return ResponseError(
          meta,
          Status::NotFound("server " + std::to_string(post_->rank()) +
                           " has no replica handle (set_replica_handle)"));
    }
    replica_handle_(meta, kvs);
  }

  // ---- Replication: the primary's side (ReplicaHold) --------------------

  // Sends the replica a copy of the push, as the worker's. The copy owns
  // its bytes (ReplicaCopy): the received frames go to the handle, which
  // may sum into them before ZeroMQ has sent the copy.
  void Forward(const KVMeta& meta, const RawKVPairs& kvs) {
    Message copy =
        ReplicaCopy(meta, kvs, val_type_, post_->rank(), hold_.replica_id());
    hold_.Forwarded(meta);
    SendCopy(&copy);
  }

  void SendCopy(Message* copy) {
    Status st = post_->Send(copy);
    if (!st.ok()) {
      LOG(WARNING) << "copy for " << post_->DescribeNode(copy->meta.recver())
                   << " not sent: " << st;
    }
  }

  // The replica answered a copy or a step forward: the workers' answers
  // that waited for it may go.
  void OnReplicaAnswer(const pb::Meta& m) {
    ReplicaHold::ReplicaAnswer answer =
        hold_.OnReplicaAnswer(m.origin(), m.customer_id(), m.timestamp());
    if (answer.duplicate) post_->CountDuplicate();
    if (!answer.duplicate) post_->metrics().ReplicaAnswered();
    for (Message& release : answer.release) Send(&release);
  }

  // A co-located worker named where the pulled values go: copy them there
  // and answer with that memory (the van sends a reference to it). Falls
  // back to sending the bytes when the size differs or the worker's memory
  // cannot be mapped.
  RawKVPairs WriteInPlace(const KVMeta& req, const RawKVPairs& res) {
    const std::shared_ptr<const pb::SharedRef>& into =
        RequestInternals::Of(req).reply_into;
    if (into == nullptr || !filters_.empty() ||
        into->bytes() != res.vals.size() || res.vals.empty()) {
      return res;
    }
    StatusOr<SArray<char>> dst = post_->ResolveShared(*into, res.vals.size());
    if (!dst.ok()) {
      LOG_FIRST_N(WARNING, 1) << "answering " << post_->DescribeNode(req.sender)
                              << " by socket: " << dst.status();
      return res;
    }
    if (dst->data() != res.vals.data()) {
      std::memcpy(dst->data(), res.vals.data(), res.vals.size());
    }
    RawKVPairs placed = res;
    placed.vals = *dst;
    return placed;
  }

  // Large values for a co-located worker that copies them out of the
  // answer (KVMeta::share_answer), not in shared memory already, go in a
  // region of their own (CopyForMessage): one write here and a mapping
  // there, instead of two copies and a fresh buffer's page faults through
  // the socket. (A worker adopting the answer keeps the socket's frame.)
  RawKVPairs ShareLarge(int to, RawKVPairs res) const {
    pb::SharedRef ref;
    // Only when resending: then the answer (and its region) is kept until
    // the worker acknowledges it, which it does once it mapped the region;
    // without resends the region could be gone before the worker maps it.
    if (!dedup_on_ || res.vals.size() < kSharedCopyBytes || !filters_.empty() ||
        !post_->van().SharesMemoryWith(to) ||
        post_->FindShared(res.vals.data(), res.vals.size(), &ref)) {
      return res;
    }
    res.vals = CopyForMessage(res.vals.data(), res.vals.size(), true);
    return res;
  }

  Postoffice* const post_;
  Node* const node_;
  FilterChain filters_{"KVServer", [post = post_](int id) {
                         return post->van().SharesMemoryWith(id);
                       }};
  const int app_id_;
  const int val_type_;
  const size_t val_size_;
  const bool dedup_on_ = post_->config().resend_timeout_ms > 0;
  const int replicas_ = post_->config().replicas;
  const bool restarts_ = post_->config().max_restarts > 0;
  Mutex incarnation_mu_;
  std::unordered_map<int, int> incarnation_ GUARDED_BY(incarnation_mu_);
  RequestDedup dedup_;

  // The answers to forwarded pushes, waiting for the replica's.
  ReplicaHold hold_;
  // The pushes the handle replicates by step (SetReplicaSteps; set before
  // the handle, then only read).
  std::function<bool(const KVMeta&)> stepped_;
  std::atomic<int> next_ticket_{0};

  RawHandle handle_;
  bool registered_ = false;
  std::shared_ptr<CallGate> gate_;  // of the registered failure callback
  // Held while the replica handle runs, so that clearing it waits.
  Mutex replica_mu_;
  RawHandle replica_handle_ GUARDED_BY(replica_mu_);
  Mutex failure_mu_;
  FailureHandle failure_handle_ GUARDED_BY(failure_mu_);
  FailureHandle replica_failure_handle_ GUARDED_BY(failure_mu_);
};

KVServerCore::KVServerCore(Node* node, int app_id, int val_type,
                           size_t val_size)
    : impl_(std::make_unique<Impl>(node, app_id, val_type, val_size)) {}
KVServerCore::~KVServerCore() = default;
Node* KVServerCore::node() const { return impl_->node(); }
void KVServerCore::SetHandle(RawHandle handle, bool replica) {
  impl_->SetHandle(std::move(handle), replica);
}
void KVServerCore::ClearHandle(bool replica) { impl_->ClearHandle(replica); }
void KVServerCore::SetFailureHandle(FailureHandle handle, bool replica) {
  impl_->SetFailureHandle(std::move(handle), replica);
}
void KVServerCore::Response(const KVMeta& req, const RawKVPairs& res) {
  impl_->Response(req, res);
}
void KVServerCore::ResponseError(const KVMeta& req, const Status& error) {
  impl_->ResponseError(req, error);
}
Status KVServerCore::AddFilter(std::shared_ptr<Filter> filter) {
  return impl_->AddFilter(std::move(filter));
}
bool KVServerCore::SetReplicaSteps(std::function<bool(const KVMeta&)> stepped) {
  return impl_->SetReplicaSteps(std::move(stepped));
}
bool KVServerCore::ReplicateStep(int cmd, int priority, const RawKVPairs& kvs,
                                 const std::vector<KVMeta>& covers) {
  return impl_->ReplicateStep(cmd, priority, kvs, covers);
}

}  // namespace detail
}  // namespace ps
