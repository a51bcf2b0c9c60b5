// FilterChain: the filters stage of the KV data path (ps/filter.h), on
// whole messages. Encode runs each filter over an encoded message's frames
// and names on its header (Meta.filters) those that rewrote them; Decode
// undoes them, last first, with the filters of the same names, and gives
// the frames back their element types (Meta.val_type for the values) so
// that the decode stage checks them as it checks any message.
//
// Thread-safety: Add before the first Encode/Decode; those may then run on
// any thread, several at once.
#ifndef PS_SRC_KV_FILTER_CHAIN_H_
#define PS_SRC_KV_FILTER_CHAIN_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ps/filter.h"
#include "ps/status.h"
#include "van/message.h"

namespace ps {
namespace detail {

class FilterChain {
 public:
  // `owner` names the chain's app in errors ("KVWorker", "KVServer");
  // shared(id): whether values to and from node `id` go by reference
  // (FilterContext::shared; none: never).
  explicit FilterChain(std::string owner,
                       std::function<bool(int)> shared = nullptr)
      : owner_(std::move(owner)), shared_(std::move(shared)) {}
  // Appends `filter`; a second filter of the same name is refused.
  Status Add(std::shared_ptr<Filter> filter);
  bool empty() const { return filters_.empty(); }
  // Rewrites msg's data frames for the wire (to msg.meta.recver()).
  Status Encode(Message* msg) const;
  // Undoes the filters msg's header names (from msg.meta.sender()).
  // Errors name the filter; msg is then not to be used.
  Status Decode(Message* msg) const;

 private:
  Filter* Find(const std::string& name) const;
  FilterContext ContextOf(const pb::Meta& m, int peer) const;

  const std::string owner_;
  const std::function<bool(int)> shared_;
  std::vector<std::shared_ptr<Filter>> filters_;
};

}  // namespace detail
}  // namespace ps

#endif  // PS_SRC_KV_FILTER_CHAIN_H_
