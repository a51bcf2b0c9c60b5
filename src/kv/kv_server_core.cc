// KVServerCore: the server's hops, OnRequest (DecodeKVPairs, the handle) and
// Response (AddKVFrames, Postoffice::Send) or ResponseError (an answer with
// control.error and no frames). With resending on (PS_RESEND_TIMEOUT_MS), a
// request that comes again is applied once (Seen): dropped while its answer
// is pending; once answered, answered again without applying its values.
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>

#include "kv/call_gate.h"
#include "kv/slicer.h"
#include "postoffice/postoffice.h"
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
  Impl(Node* node, int app_id, int val_type, size_t val_size)
      : post_(node->postoffice()),
        app_id_(app_id),
        val_type_(val_type),
        val_size_(val_size) {}
  ~Impl() { ClearHandle(); }

  void SetHandle(RawHandle handle) {
    CHECK(!registered_) << "set_request_handle called twice";
    handle_ = std::move(handle);
    registered_ = true;
    gate_ = std::make_shared<CallGate>();
    post_->RegisterCustomer(
        true, app_id_, -1, [this](Message&& msg) { OnRequest(std::move(msg)); },
        [this, gate = gate_](int id, const Status& why) {
          gate->Call([&] { OnFailure(id, why); });
        });
  }

  void ClearHandle() {
    if (!registered_) return;
    post_->UnregisterCustomer(true, app_id_, -1);  // waits out a handler
    gate_->Close();                                // and a failure handler
    registered_ = false;  // handle_ stays: it may be the caller
    MutexLock lock(&failure_mu_);
    failure_handle_ = nullptr;
  }

  void SetFailureHandle(FailureHandle handle) {
    MutexLock lock(&failure_mu_);
    failure_handle_ = std::move(handle);
  }

  void OnFailure(int id, const Status& why) {
    FailureHandle handle;
    {
      MutexLock lock(&failure_mu_);
      handle = failure_handle_;
    }
    if (handle) handle(id, why);
  }

  void OnRequest(Message&& msg) {
    const pb::Meta& m = msg.meta;
    StatusOr<RawKVPairs> kvs =
        DecodeKVPairs(msg, m.push(), val_type_, val_size_);
    if (!kvs.ok()) {
      post_->CountDropped(m.sender(), "bad request: " + kvs.status().message());
      Status why = Status::InvalidArgument(kvs.status().message());
      if (m.push() && m.data_type_size() >= 2 && m.data_type(1) != val_type_) {
        why = Status::InvalidArgument(
            std::string("server serves ") + TypeName(val_type_) +
            " values; the request has " + TypeName(m.data_type(1)));
      }
      ResponseError(RequestMeta(m), why);
      return;
    }
    KVMeta meta = RequestMeta(m);
    if (dedup_) {
      Record again;
      if (Seen(meta, &again)) {
        post_->CountDuplicate();
        if (!again.answered) return;  // its answer is on its way
        if (!again.error.empty()) {
          return ResponseError(meta, Status(static_cast<Status::Code>(
                                                again.error_code),
                                            again.error));
        }
        if (!m.pull()) return Response(meta, RawKVPairs());
        // Serve the pull again, without the values it pushed (applied).
        meta.push = false;
        kvs->vals = SArray<char>();
        kvs->lens = SArray<int>();
      }
    }
    meta.vals_borrowed = m.shared_size() > 0;
    if (m.has_reply_into()) {
      meta.reply_into = std::make_shared<pb::SharedRef>(m.reply_into());
    }
    handle_(meta, *kvs);
  }

  void Response(const KVMeta& req, const RawKVPairs& res) {
    if (dedup_) MarkAnswered(req, Status::OK());
    Message msg = AnswerTo(req);
    if (req.pull) AddKVFrames(WriteInPlace(req, res), true, val_type_, &msg);
    Status st = post_->Send(&msg);
    if (st.code() == Status::kInvalidArgument) {
      // Too large to send (PS_MAX_MESSAGE_BYTES): the worker learns why
      // instead of waiting for an answer that never comes.
      ResponseError(req, st);
    } else if (!st.ok()) {
      LOG(WARNING) << "answer to " << post_->DescribeNode(req.sender)
                   << " not sent: " << st;
    }
  }

  void ResponseError(const KVMeta& req, const Status& error) {
    CHECK(!error.ok()) << "ResponseError with OK";
    if (dedup_) MarkAnswered(req, error);
    Message msg = AnswerTo(req);
    msg.meta.mutable_control()->set_error(
        error.message().empty() ? "(no reason given)" : error.message());
    msg.meta.mutable_control()->set_error_code(error.code());
    Send(req, &msg);
  }

 private:
  static KVMeta RequestMeta(const pb::Meta& m) {
    KVMeta meta;
    meta.cmd = m.head();
    meta.push = m.push();
    meta.pull = m.pull();
    meta.sender = m.sender();
    meta.timestamp = m.timestamp();
    meta.customer_id = m.customer_id();
    meta.app_id = m.app_id();
    meta.priority = m.priority();
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
    m.set_recver(req.sender);
    return msg;
  }

  void Send(const KVMeta& req, Message* msg) {
    Status st = post_->Send(msg);
    if (!st.ok()) {
      LOG(WARNING) << "answer to " << post_->DescribeNode(req.sender)
                   << " not sent: " << st;
    }
  }

  // A co-located worker named where the pulled values go: copy them there
  // and answer with that memory (the van sends a reference to it). Falls
  // back to sending the bytes when the size differs or the worker's memory
  // cannot be mapped.
  RawKVPairs WriteInPlace(const KVMeta& req, const RawKVPairs& res) {
    if (req.reply_into == nullptr ||
        req.reply_into->bytes() != res.vals.size() || res.vals.empty()) {
      return res;
    }
    StatusOr<SArray<char>> dst =
        SharedMemory::Get().Resolve(*req.reply_into, res.vals.size());
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

  // What this server did with one request of a worker's customer.
  struct Record {
    bool answered = false;
    int error_code = 0;  // answered with this error (empty: with data)
    std::string error;
  };
  // One worker customer's last requests.
  struct Recent {
    std::unordered_map<int, Record> by_ts;
    std::deque<int> order;  // oldest first
  };
  // How many requests per worker customer are remembered: far more than
  // can be in flight while one is resent.
  static constexpr size_t kRecentPerCustomer = 4096;

  // Whether req came before (its record in *again); else remembers it.
  bool Seen(const KVMeta& req, Record* again) EXCLUDES(dedup_mu_) {
    MutexLock lock(&dedup_mu_);
    Recent& r = recent_[{req.sender, req.customer_id}];
    auto it = r.by_ts.find(req.timestamp);
    if (it != r.by_ts.end()) {
      *again = it->second;
      return true;
    }
    r.by_ts.emplace(req.timestamp, Record());
    r.order.push_back(req.timestamp);
    if (r.order.size() > kRecentPerCustomer) {
      r.by_ts.erase(r.order.front());
      r.order.pop_front();
    }
    return false;
  }

  void MarkAnswered(const KVMeta& req, const Status& error)
      EXCLUDES(dedup_mu_) {
    MutexLock lock(&dedup_mu_);
    auto r = recent_.find({req.sender, req.customer_id});
    if (r == recent_.end()) return;
    auto it = r->second.by_ts.find(req.timestamp);
    if (it == r->second.by_ts.end()) return;
    it->second.answered = true;
    if (!error.ok()) {
      it->second.error_code = error.code();
      it->second.error =
          error.message().empty() ? "(no reason given)" : error.message();
    }
  }

  Postoffice* const post_;
  const int app_id_;
  const int val_type_;
  const size_t val_size_;
  const bool dedup_ = post_->config().resend_timeout_ms > 0;
  Mutex dedup_mu_;
  // By (worker id, customer id).
  std::map<std::pair<int, int>, Recent> recent_ GUARDED_BY(dedup_mu_);
  RawHandle handle_;
  bool registered_ = false;
  std::shared_ptr<CallGate> gate_;  // of the registered failure callback
  Mutex failure_mu_;
  FailureHandle failure_handle_ GUARDED_BY(failure_mu_);
};

KVServerCore::KVServerCore(Node* node, int app_id, int val_type,
                           size_t val_size)
    : impl_(std::make_unique<Impl>(node, app_id, val_type, val_size)) {}
KVServerCore::~KVServerCore() = default;
void KVServerCore::SetHandle(RawHandle handle) {
  impl_->SetHandle(std::move(handle));
}
void KVServerCore::ClearHandle() { impl_->ClearHandle(); }
void KVServerCore::SetFailureHandle(FailureHandle handle) {
  impl_->SetFailureHandle(std::move(handle));
}
void KVServerCore::Response(const KVMeta& req, const RawKVPairs& res) {
  impl_->Response(req, res);
}
void KVServerCore::ResponseError(const KVMeta& req, const Status& error) {
  impl_->ResponseError(req, error);
}

}  // namespace detail
}  // namespace ps
