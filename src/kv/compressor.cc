// Compressor: float codecs as a filter (ps/compress.h). This file reads and
// writes a message's frames and its filter note; the codecs are codecs.h's,
// the state's changes compress_state.cc's.
//
// On the wire, a compressed message's values frame is one segment per key,
// in key order, each in its key's codec (codecs.h), where n is the key's
// count of values (its lens entry, or the values split evenly over the
// keys). The filter note: a byte of parts, then those present, in this
// order:
//   values    (kValuesPart) uint64 count of values, uint32 runs, then per
//             run (uint32 keys, uint8 Codec::Kind | kDelta for a delta)
//   claims    (kClaimsPart, a pull request) uint64 per key: the version of
//             the key's view the worker holds, 0 for none
//   versions  (kVersionsPart, a delta-pull answer) per key (uint64 base,
//             uint64 new): the view version a delta starts from (0: whole
//             values) and the one it makes
// All integers and floats little-endian, as the hosts that run this.
#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kv/codecs.h"
#include "kv/compress_state.h"
#include "ps/compress.h"
#include "ps/kv_core.h"

namespace ps {

namespace {

// Note parts (its first byte says which follow, in this order).
constexpr uint8_t kValuesPart = 1;    // u64 values, u32 runs, (u32, u8) runs
constexpr uint8_t kClaimsPart = 2;    // u64 a key: the version a worker holds
constexpr uint8_t kVersionsPart = 4;  // (u64 base, u64 new) a key

// The per-key counts of values of a message: its lens, or its values split
// evenly over its keys.
Status CountsOf(const KVFrames& f, size_t num_keys, uint64_t num_values,
                std::vector<uint64_t>* counts) {
  counts->assign(num_keys, 0);
  if (f.has_lens) {
    if (f.lens.size() != 4 * num_keys) {
      return Status::Corruption(std::to_string(f.lens.size()) +
                                " bytes of lens for " +
                                std::to_string(num_keys) + " keys");
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < num_keys; ++i) {
      int32_t len;
      std::memcpy(&len, f.lens.data() + 4 * i, 4);
      if (len < 0) {
        return Status::Corruption("key " + std::to_string(i) + " has length " +
                                  std::to_string(len));
      }
      (*counts)[i] = static_cast<uint64_t>(len);
      sum += static_cast<uint64_t>(len);
    }
    if (sum != num_values) {
      return Status::Corruption("lens add up to " + std::to_string(sum) +
                                " values; the message has " +
                                std::to_string(num_values));
    }
    return Status::OK();
  }
  if (num_keys == 0 ? num_values != 0 : num_values % num_keys != 0) {
    return Status::Corruption(std::to_string(num_values) +
                              " values do not split evenly over " +
                              std::to_string(num_keys) + " keys");
  }
  if (num_keys > 0) counts->assign(num_keys, num_values / num_keys);
  return Status::OK();
}

uint64_t KeyAt(const KVFrames& f, size_t i) {
  uint64_t key;
  std::memcpy(&key, f.keys.data() + 8 * i, 8);
  return key;
}

bool AllFinite(const float* v, size_t n) {
  return std::all_of(v, v + n, [](float x) { return std::isfinite(x); });
}

// The values as floats (aligned: a copy into *aligned only if they are not).
const float* AlignedFloats(const SArray<char>& in, uint64_t num_values,
                           std::vector<float>* aligned) {
  if (reinterpret_cast<uintptr_t>(in.data()) % alignof(float) == 0) {
    return reinterpret_cast<const float*>(in.data());
  }
  aligned->resize(num_values);
  if (num_values > 0) std::memcpy(aligned->data(), in.data(), in.size());
  return aligned->data();
}

// The note's values part: the count of values, then the keys' codecs as
// runs of keys of one kind.
void AppendRuns(const std::vector<KeyCodec>& plan, uint64_t num_values,
                std::string* note) {
  auto kind_of = [&plan](size_t i) {
    return static_cast<uint8_t>(plan[i].codec.kind |
                                (plan[i].delta ? kDelta : 0));
  };
  note->at(0) = static_cast<char>(note->at(0) | kValuesPart);
  Append<uint64_t>(note, num_values);
  std::string runs;
  uint32_t num_runs = 0;
  for (size_t i = 0; i < plan.size();) {
    const uint8_t kind = kind_of(i);
    uint32_t run = 1;
    while (i + run < plan.size() && kind_of(i + run) == kind) ++run;
    Append<uint32_t>(&runs, run);
    runs.push_back(static_cast<char>(kind));
    ++num_runs;
    i += run;
  }
  Append<uint32_t>(note, num_runs);
  note->append(runs);
}

}  // namespace

StatusOr<std::shared_ptr<Compressor>> Compressor::Make(
    CompressOptions options) {
  std::vector<Codec> all = {options.push, options.pull};
  for (const auto& r : options.push_ranges) all.push_back(r.push);
  for (const Codec& c : all) {
    if ((c.kind == Codec::kTopK || c.kind == Codec::kRandomK) &&
        !(c.ratio > 0 && c.ratio <= 1)) {
      return Status::InvalidArgument("codec " + c.ToString() +
                                     ": ratio not in (0, 1]");
    }
  }
  return std::shared_ptr<Compressor>(new Compressor(std::move(options)));
}

Compressor::Compressor(CompressOptions options)
    : options_(std::move(options)), feedback_(new Feedback) {
  MutexLock lock(&feedback_->mu);
  feedback_->rng.seed(options_.seed);
}

Compressor::~Compressor() = default;

const Codec& Compressor::PushCodecOf(uint64_t key) const {
  for (const auto& r : options_.push_ranges) {
    if (key >= r.keys.begin() && key < r.keys.end()) return r.push;
  }
  return options_.push;
}

StatusOr<bool> Compressor::Encode(const FilterContext& ctx, KVFrames* frames,
                                  std::string* note) {
  if (ctx.shared && !options_.compress_shared) return false;
  const size_t num_keys = frames->keys.size() / 8;
  const bool delta_pulls = options_.pull.feedback();
  std::string n(1, '\0');
  MutexLock lock(&feedback_->mu);
  if (frames->has_vals && frames->val_type == detail::kTypeFloat) {
    Status st = feedback_->EncodeValues(*this, ctx, frames, &n);
    if (!st.ok()) return st;
  }
  if (ctx.request && ctx.pull && delta_pulls) {
    // The version of each key this worker holds (0: none): a server
    // answers with what changed since, or with everything.
    n[0] = static_cast<char>(n[0] | kClaimsPart);
    for (size_t i = 0; i < num_keys; ++i) {
      auto it = feedback_->views.find(KeyAt(*frames, i));
      Append<uint64_t>(&n,
                       it == feedback_->views.end() ? 0 : it->second.version);
    }
  }
  if (n[0] == 0) return false;
  *note = std::move(n);
  return true;
}

Status Compressor::Feedback::EncodeValues(const Compressor& compressor,
                                          const FilterContext& ctx,
                                          KVFrames* frames, std::string* note) {
  const size_t num_keys = frames->keys.size() / 8;
  const uint64_t num_values = frames->vals.size() / 4;
  std::vector<uint64_t> counts;
  Status st = CountsOf(*frames, num_keys, num_values, &counts);
  if (!st.ok()) return st;
  // Delta answers go to a request that claimed versions (the worker pulls
  // deltas); to others, whole values.
  Claims claimed;
  const bool answer_deltas =
      !ctx.request && compressor.options().pull.feedback() &&
      TakeClaims({ctx.peer, ctx.customer_id, uint64_t(ctx.timestamp)},
                 &claimed);
  const SArray<char> in = frames->vals;  // held until the values are written
  std::vector<float> aligned;
  const float* vals = AlignedFloats(in, num_values, &aligned);
  std::vector<KeyCodec> plan;
  size_t bytes = 0;
  if (!PlanKeys(compressor, ctx, *frames, counts, vals,
                answer_deltas ? &claimed : nullptr, &plan, &bytes)) {
    return Status::OK();
  }
  AppendRuns(plan, num_values, note);
  SArray<char> out(bytes);
  PutSegments(ctx, *frames, counts, plan, answer_deltas, vals, out.data(),
              out.data() + out.size());
  if (answer_deltas) {
    note->at(0) = static_cast<char>(note->at(0) | kVersionsPart);
    note->append(versions_out);
    versions_out.clear();
  }
  frames->vals = out;
  return Status::OK();
}

bool Compressor::Feedback::PlanKeys(const Compressor& compressor,
                                    const FilterContext& ctx,
                                    const KVFrames& frames,
                                    const std::vector<uint64_t>& counts,
                                    const float* vals, const Claims* claimed,
                                    std::vector<KeyCodec>* plan,
                                    size_t* bytes) {
  const CompressOptions& opts = compressor.options();
  const Codec raw;
  const Codec& pull = opts.pull.feedback() ? raw : opts.pull;
  bool any = claimed != nullptr;
  plan->assign(counts.size(), KeyCodec());
  for (size_t i = 0; i < counts.size(); ++i) {
    const uint64_t key = KeyAt(frames, i);
    KeyCodec& kc = (*plan)[i];
    kc.codec = ctx.request ? compressor.PushCodecOf(key) : pull;
    // A non-finite value travels whole, raw, and starts its key's
    // feedback afresh (a residual or view of inf would never recover).
    const bool finite = (!kc.codec.feedback() && claimed == nullptr) ||
                        AllFinite(vals, counts[i]);
    vals += counts[i];
    if (!finite) {
      kc.codec = raw;
      residual.erase(key);
    }
    if (claimed != nullptr) {
      // Per key of a delta-pull answer: a delta if the worker holds the
      // very version of the view this server has of it, else whole, raw.
      const View& w = peer_views[{ctx.peer, ctx.customer_id, key}];
      auto claim = claimed->find(key);
      kc.delta = finite && claim != claimed->end() && claim->second != 0 &&
                 claim->second == w.version && w.values.size() == counts[i];
      kc.codec = kc.delta ? opts.pull : raw;
    }
    any |= kc.codec.kind != Codec::kNone;
    *bytes += SegmentBytes(kc.codec, counts[i]);
  }
  return any;
}

void Compressor::Feedback::PutSegments(const FilterContext& ctx,
                                       const KVFrames& frames,
                                       const std::vector<uint64_t>& counts,
                                       const std::vector<KeyCodec>& plan,
                                       bool answer_deltas, const float* vals,
                                       char* p, const char* end) {
  Scratch scratch;
  for (size_t i = 0; i < plan.size(); ++i) {
    const Codec& c = plan[i].codec;
    const size_t len = counts[i];
    const float* v = vals;
    vals += len;
    const uint64_t key = KeyAt(frames, i);
    if (answer_deltas) {
      PutAnswer({ctx.peer, ctx.customer_id, key}, plan[i], v, len, &scratch,
                &p);
    } else if (c.feedback()) {
      PutPush(key, c, v, len, &scratch, &p);
    } else {
      PutSegment(c, v, nullptr, len, &rng, &scratch.segment, &p);
    }
  }
  CHECK_EQ(p, end);
}

namespace {

// Decode's first checks, before any state is touched: the keys, the note's
// parts, and which parts go which way.
Status CheckParts(const FilterContext& ctx, const KVFrames& frames,
                  Reader* note, uint8_t* parts) {
  if (frames.keys.size() % 8 != 0) {
    return Status::Corruption(std::to_string(frames.keys.size()) +
                              " bytes of keys");
  }
  if (!note->Get(parts) || *parts == 0 ||
      (*parts & ~(kValuesPart | kClaimsPart | kVersionsPart)) != 0) {
    return Status::Corruption("note too short or of unknown parts");
  }
  if ((*parts & kClaimsPart) && !(ctx.request && ctx.pull)) {
    return Status::Corruption("versions claimed by what is no pull request");
  }
  if ((*parts & kVersionsPart) && !(!ctx.request && (*parts & kValuesPart))) {
    return Status::Corruption("view versions on what is no pull answer");
  }
  return Status::OK();
}

// The note's values part: the count of values (at most max_values) and
// each key's kind (Codec::Kind | kDelta).
Status ReadValuesPart(Reader* note, const KVFrames& frames, size_t num_keys,
                      uint64_t max_values, uint64_t* num_values,
                      std::vector<uint8_t>* kinds) {
  if (!frames.has_vals || frames.val_type != detail::kTypeFloat) {
    return Status::Corruption("compressed values without float values");
  }
  uint32_t num_runs = 0;
  if (!note->Get(num_values) || !note->Get(&num_runs)) {
    return Status::Corruption("note too short");
  }
  if (*num_values > max_values) {
    return Status::Corruption(
        "the message decodes to " + std::to_string(*num_values) +
        " values; at most " + std::to_string(max_values) + " are taken");
  }
  kinds->reserve(num_keys);
  for (uint32_t i = 0; i < num_runs; ++i) {
    uint32_t run;
    uint8_t kind;
    if (!note->Get(&run) || !note->Get(&kind) ||
        (kind & ~kDelta) > Codec::kOneBit || run == 0 ||
        run > num_keys - kinds->size()) {
      return Status::Corruption("bad codec runs in the note");
    }
    kinds->insert(kinds->end(), run, kind);
  }
  if (kinds->size() != num_keys) {
    return Status::Corruption("the note names codecs of " +
                              std::to_string(kinds->size()) + " keys of " +
                              std::to_string(num_keys));
  }
  return Status::OK();
}

// The note's claims part: per key, the version of its view a worker holds.
Status ReadClaims(Reader* note, const KVFrames& frames, size_t num_keys,
                  Claims* claimed) {
  for (size_t i = 0; i < num_keys; ++i) {
    uint64_t version;
    if (!note->Get(&version)) return Status::Corruption("versions cut short");
    (*claimed)[KeyAt(frames, i)] = version;
  }
  return Status::OK();
}

// The note's versions part: per key, (base, new).
Status ReadVersions(Reader* note, size_t num_keys, ViewVersions* versions) {
  versions->resize(num_keys);
  for (auto& v : *versions) {
    if (!note->Get(&v.first) || !note->Get(&v.second)) {
      return Status::Corruption("versions cut short");
    }
  }
  return Status::OK();
}

// The bytes the codecs need at least, checked before anything is allocated.
Status CheckLeastBytes(const std::vector<uint8_t>& kinds,
                       const std::vector<uint64_t>& counts, size_t bytes) {
  uint64_t least = 0;
  for (size_t i = 0; i < kinds.size(); ++i) {
    Codec c;
    c.kind = static_cast<Codec::Kind>(kinds[i] & ~kDelta);
    least += c.kind == Codec::kTopK || c.kind == Codec::kRandomK
                 ? 4
                 : SegmentBytes(c, counts[i]);
  }
  if (least > bytes) {
    return Status::Corruption(
        "the note's codecs need at least " + std::to_string(least) +
        " bytes of values; the message has " + std::to_string(bytes));
  }
  return Status::OK();
}

}  // namespace

Status Compressor::Feedback::DecodeKeys(const KVFrames& frames,
                                        const std::vector<uint8_t>& kinds,
                                        const std::vector<uint64_t>& counts,
                                        const ViewVersions& versions,
                                        float* o) {
  Reader in(frames.vals.data(), frames.vals.size());
  for (size_t i = 0; i < kinds.size(); ++i) {
    const std::string where = " (key " + std::to_string(KeyAt(frames, i)) + ")";
    if (kinds[i] & kDelta) {
      // A delta moves this worker's view of the key, from the version the
      // view is at.
      Status st = CheckDelta(KeyAt(frames, i),
                             versions.empty() ? nullptr : &versions[i],
                             counts[i], where);
      if (!st.ok()) return st;
    }
    Status st = GetSegment(static_cast<Codec::Kind>(kinds[i] & ~kDelta),
                           counts[i], &in, o);
    if (!st.ok()) return Status::Corruption(st.message() + where);
    o += counts[i];
  }
  if (in.left() != 0) {
    return Status::Corruption(std::to_string(in.left()) +
                              " bytes after the last key's values");
  }
  return Status::OK();
}

Status Compressor::Decode(const FilterContext& ctx, const std::string& note,
                          KVFrames* frames) {
  Reader nr(note.data(), note.size());
  uint8_t parts = 0;
  Status st = CheckParts(ctx, *frames, &nr, &parts);
  if (!st.ok()) return st;
  const size_t num_keys = frames->keys.size() / 8;
  Feedback& fb = *feedback_;
  MutexLock lock(&fb.mu);
  std::vector<uint8_t> kinds;
  uint64_t num_values = 0;
  if (parts & kValuesPart) {
    st = ReadValuesPart(&nr, *frames, num_keys, options_.max_values,
                        &num_values, &kinds);
    if (!st.ok()) return st;
  }
  if (parts & kClaimsPart) {
    // A pull request's versions, for this server's answer to it.
    Claims claimed;
    st = ReadClaims(&nr, *frames, num_keys, &claimed);
    if (!st.ok()) return st;
    fb.StoreClaims({ctx.peer, ctx.customer_id, uint64_t(ctx.timestamp)},
                   std::move(claimed));
  }
  ViewVersions versions;
  if (parts & kVersionsPart) {
    st = ReadVersions(&nr, num_keys, &versions);
    if (!st.ok()) return st;
  }
  if (nr.left() != 0) {
    return Status::Corruption(std::to_string(nr.left()) +
                              " bytes after the note's parts");
  }
  if (!(parts & kValuesPart)) return Status::OK();
  std::vector<uint64_t> counts;
  st = CountsOf(*frames, num_keys, num_values, &counts);
  if (st.ok()) st = CheckLeastBytes(kinds, counts, frames->vals.size());
  if (!st.ok()) return st;
  SArray<char> out(4 * num_values);
  float* o = reinterpret_cast<float*>(out.data());
  st = fb.DecodeKeys(*frames, kinds, counts, versions, o);
  if (!st.ok()) return st;
  // All of it read and checked: now the views change and the pull gets them.
  for (size_t i = 0; i < num_keys && !versions.empty(); ++i) {
    fb.ApplyAnswer(KeyAt(*frames, i), (kinds[i] & kDelta) != 0, counts[i],
                   versions[i].second, o);
    o += counts[i];
  }
  frames->vals = out;
  return Status::OK();
}

}  // namespace ps
