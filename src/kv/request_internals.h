// The internal part of a request's KVMeta (KVMeta::internal): how the
// server answers it. KVServerCore sets it when the request arrives and
// reads it when the handle answers; a handle copies it with the meta and
// never reads it. Shared by the copies of a meta and never changed in
// place: a change (Change) makes the meta a copy of its own. Internal.
#ifndef PS_SRC_KV_REQUEST_INTERNALS_H_
#define PS_SRC_KV_REQUEST_INTERNALS_H_

#include <memory>
#include <utility>

#include "ps/kv_core.h"
#include "ps/sarray.h"

namespace ps {
namespace pb {
class SharedRef;
}  // namespace pb

namespace detail {

struct RequestInternals {
  // Where in the worker's shared memory the answer to a pull goes (set by
  // the transport); Response writes it there when it fits.
  std::shared_ptr<const pb::SharedRef> reply_into;
  // Replication: the node the answer goes to when not KVMeta::sender (the
  // primary that forwarded a push; -1: the sender).
  int reply_to = -1;
  // Restarts (PS_MAX_RESTARTS): how many times the sender had rejoined
  // when the request came; an answer to an earlier process of it is not
  // sent.
  int incarnation = 0;
  // Pulls: the request's keys. An answer whose keys are this very array
  // (res.keys = req_data.keys) goes without them: the worker has them.
  SArray<Key> asked_keys;
  // Pulls: the worker copies the values out of the answer, so large ones
  // may go to a co-located worker in shared memory of their own.
  bool share_answer = false;

  // The internals of `meta`: the defaults when it has none (a meta made by
  // hand, as in tests).
  static const RequestInternals& Of(const KVMeta& meta) {
    static const RequestInternals kNone;
    return meta.internal ? *meta.internal : kNone;
  }
  // Gives `meta` internals of its own: its own, changed by change(&copy).
  template <typename Fn>
  static void Change(KVMeta* meta, Fn&& change) {
    auto next = std::make_shared<RequestInternals>(Of(*meta));
    change(next.get());
    meta->internal = std::move(next);
  }
};

}  // namespace detail
}  // namespace ps

#endif  // PS_SRC_KV_REQUEST_INTERNALS_H_
