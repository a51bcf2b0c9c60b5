// FilterChain: the filters stage on messages (filter_chain.h).
#include "kv/filter_chain.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "van/codec.h"

namespace ps {
namespace detail {

namespace {

// A data message's frames by name: keys, then the values when the message
// carries them (a push request, a pull answer), then lens when present.
bool ToFrames(const Message& msg, KVFrames* frames) {
  const pb::Meta& m = msg.meta;
  frames->has_vals = m.request() ? m.push() : m.pull();
  const size_t want = 1 + (frames->has_vals ? 1 : 0);
  if (msg.data.size() != want && msg.data.size() != want + 1) return false;
  frames->has_lens = msg.data.size() == want + 1;
  frames->keys = msg.data[0];
  if (frames->has_vals) frames->vals = msg.data[1];
  if (frames->has_lens) frames->lens = msg.data.back();
  frames->val_type = m.val_type();
  return true;
}

}  // namespace

FilterContext FilterChain::ContextOf(const pb::Meta& m, int peer) const {
  FilterContext ctx;
  ctx.request = m.request();
  ctx.push = m.push();
  ctx.pull = m.pull();
  ctx.cmd = m.head();
  ctx.app_id = m.app_id();
  ctx.customer_id = m.customer_id();
  ctx.timestamp = m.timestamp();
  ctx.peer = peer;
  ctx.shared = shared_ != nullptr && shared_(peer);
  return ctx;
}

Status FilterChain::Add(std::shared_ptr<Filter> filter) {
  if (filter == nullptr) return Status::InvalidArgument("AddFilter(nullptr)");
  if (Find(filter->name()) != nullptr) {
    return Status::InvalidArgument("the " + owner_ + " has a filter named '" +
                                   filter->name() + "' already");
  }
  filters_.push_back(std::move(filter));
  return Status::OK();
}

Filter* FilterChain::Find(const std::string& name) const {
  for (const auto& f : filters_) {
    if (f->name() == name) return f.get();
  }
  return nullptr;
}

Status FilterChain::Encode(Message* msg) const {
  KVFrames frames;
  if (filters_.empty() || !ToFrames(*msg, &frames)) return Status::OK();
  const FilterContext ctx = ContextOf(msg->meta, msg->meta.recver());
  for (const auto& f : filters_) {
    std::string note;
    StatusOr<bool> applied = f->Encode(ctx, &frames, &note);
    if (!applied.ok()) {
      return Status(applied.status().code(), "filter '" + f->name() + "': " +
                                                 applied.status().message());
    }
    if (!*applied) continue;
    pb::FilterNote* n = msg->meta.add_filters();
    n->set_name(f->name());
    n->set_note(std::move(note));
  }
  if (msg->meta.filters_size() == 0) return Status::OK();
  // Rewritten frames are bytes; the codec checks sizes against types.
  msg->data.clear();
  msg->meta.clear_data_type();
  msg->AddData(frames.keys, pb::CHAR);
  if (frames.has_vals) msg->AddData(frames.vals, pb::CHAR);
  if (frames.has_lens) msg->AddData(frames.lens, pb::CHAR);
  return Status::OK();
}

Status FilterChain::Decode(Message* msg) const {
  const pb::Meta& m = msg->meta;
  if (m.filters_size() == 0) return Status::OK();
  for (const pb::FilterNote& n : m.filters()) {
    if (Find(n.name()) == nullptr) {
      return Status::InvalidArgument("the message was rewritten by filter '" +
                                     n.name() + "', which this " + owner_ +
                                     " does not have (AddFilter)");
    }
  }
  // Each filter runs once a message (a stranger's list could be long).
  if (static_cast<size_t>(m.filters_size()) > filters_.size()) {
    return Status::InvalidArgument(
        "the message names " + std::to_string(m.filters_size()) +
        " filters; this " + owner_ + " has " + std::to_string(filters_.size()));
  }
  KVFrames frames;
  if (!ToFrames(*msg, &frames)) {
    return Status::Corruption("filtered message with " +
                              std::to_string(msg->data.size()) +
                              " data frames");
  }
  const FilterContext ctx = ContextOf(m, m.sender());
  for (int i = m.filters_size() - 1; i >= 0; --i) {
    const pb::FilterNote& n = m.filters(i);
    Filter* f = Find(n.name());
    Status st = f->Decode(ctx, n.note(), &frames);
    if (!st.ok()) {
      return Status(st.code(), "filter '" + n.name() + "': " + st.message());
    }
  }
  // Back to typed frames, for the decode stage to check.
  const int val_type = m.val_type();
  msg->data.clear();
  msg->meta.clear_data_type();
  msg->meta.clear_filters();
  msg->AddData(Realign(frames.keys, sizeof(uint64_t)), pb::UINT64);
  if (frames.has_vals) {
    msg->AddData(
        Realign(frames.vals, std::max<size_t>(1, DataTypeSize(val_type))),
        static_cast<pb::DataType>(val_type));
  }
  if (frames.has_lens) {
    msg->AddData(Realign(frames.lens, sizeof(int32_t)), pb::INT32);
  }
  return Status::OK();
}

}  // namespace detail
}  // namespace ps
