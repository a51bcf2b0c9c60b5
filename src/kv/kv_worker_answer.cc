// KVWorkerCore's answer path (the class: kv_worker_impl.h; the request:
// kv_worker_core.cc): OnResponse takes a server's answer through whose keys
// it answers for (AnsweredSlot) -> dedup (Answered) -> StoreAnswer: filters
// (FilterChain::Decode) -> decode (DecodeKVPairs) -> PullState::Store ->
// RequestTracker::Answer -> FinishRequest; Wait hands the caller the end.
#include <memory>
#include <string>

#include "kv/kv_worker_impl.h"

namespace ps {
namespace detail {

void KVWorkerCore::Impl::OnResponse(Message&& msg) {
  int ts = msg.meta.timestamp();
  const std::optional<int> slot = AnsweredSlot(msg);
  if (!slot) return;
  const int sender = *slot;
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
    StoreAnswer(&msg, state.get(), sender);
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

void KVWorkerCore::Impl::StoreAnswer(Message* msg, PullState* state,
                                     int server) const {
  StatusOr<RawKVPairs> kvs = DecodeAnswer(msg, *state, IdToRank(server));
  Status st = kvs.ok() ? state->Store(IdToRank(server), std::move(kvs).value())
                       : kvs.status();
  if (!st.ok()) {
    post_->CountDropped(server, "bad pull answer: " + st.message());
    state->Fail(Status::Corruption(post_->DescribeNode(server) +
                                   " answered badly: " + st.message()));
  }
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

}  // namespace detail
}  // namespace ps
