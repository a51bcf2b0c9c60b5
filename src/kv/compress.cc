// Compressor: float codecs as a filter (ps/compress.h).
//
// On the wire, a compressed message's values frame is one segment per key,
// in key order, each in its key's codec:
//   none          n floats
//   fp16, bf16    n uint16
//   topk, randomk uint32 k, k uint32 indices (ascending), k floats
//   onebit        ceil(n / kOneBitChunk) float scales, ceil(n / 8) bytes of
//                 signs (bit j % 8 of byte j / 8: value j >= 0)
// where n is the key's count of values (its lens entry, or the values split
// evenly over the keys). The filter note: a byte of parts, then those
// present, in this order:
//   values    (kValuesPart) uint64 count of values, uint32 runs, then per
//             run (uint32 keys, uint8 Codec::Kind | kDelta for a delta)
//   claims    (kClaimsPart, a pull request) uint64 per key: the version of
//             the key's view the worker holds, 0 for none
//   versions  (kVersionsPart, a delta-pull answer) per key (uint64 base,
//             uint64 new): the view version a delta starts from (0: whole
//             values) and the one it makes
// All integers and floats little-endian, as the hosts that run this.
#include "ps/compress.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <unordered_map>
#include <utility>

#include "ps/kv_core.h"
#include "van/sync.h"

namespace ps {

namespace {

// IEEE binary16 from a float, rounded to nearest-even.
uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) {  // infinity, NaN (kept quiet, payload's top bits)
    return static_cast<uint16_t>(
        sign | 0x7C00u | (a > 0x7F800000u ? 0x200u | ((a >> 13) & 0x3FFu) : 0));
  }
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // inf
  if (a < 0x38800000u) {
    // Below 2^-14: a multiple of 2^-24. Adding 0.5 (whose unit in the last
    // place is 2^-24) lets the FPU round it; its mantissa is the half's.
    float abs_f;
    std::memcpy(&abs_f, &a, 4);
    const float r = abs_f + 0.5f;
    uint32_t rb;
    std::memcpy(&rb, &r, 4);
    return static_cast<uint16_t>(sign | (rb - 0x3F000000u));
  }
  const uint32_t odd = (a >> 13) & 1u;
  a -= (127u - 15u) << 23;  // the half's exponent bias
  a += 0xFFFu + odd;        // round to nearest, ties to even
  return static_cast<uint16_t>(sign | (a >> 13));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  float f;
  if (e == 0) {
    f = static_cast<float>(m) * (1.0f / 16777216.0f);  // m * 2^-24
    return sign ? -f : f;
  }
  const uint32_t x = e == 31 ? sign | 0x7F800000u | (m << 13)
                             : sign | ((e + 112) << 23) | (m << 13);
  std::memcpy(&f, &x, 4);
  return f;
}

// bfloat16: the upper half of a float, rounded to nearest-even.
uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN stays NaN
  }
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// Little-endian writes and bounded reads over byte buffers.
template <typename T>
void Put(char** p, T v) {
  std::memcpy(*p, &v, sizeof(T));
  *p += sizeof(T);
}

class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), end_(p + n) {}
  template <typename T>
  bool Get(T* v) {
    if (left() < sizeof(T)) return false;
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  // n bytes in place, or null.
  const char* Take(size_t n) {
    if (left() < n) return nullptr;
    const char* at = p_;
    p_ += n;
    return at;
  }
  size_t left() const { return static_cast<size_t>(end_ - p_); }

 private:
  const char* p_;
  const char* end_;
};

size_t SparseCount(double ratio, size_t n) {
  if (n == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  return std::min(n, std::max<size_t>(1, static_cast<size_t>(k)));
}

size_t OneBitScales(size_t n) { return (n + kOneBitChunk - 1) / kOneBitChunk; }

// The bytes of one key's segment of n values in codec c.
size_t SegmentBytes(const Codec& c, size_t n) {
  switch (c.kind) {
    case Codec::kNone:
      return 4 * n;
    case Codec::kFp16:
    case Codec::kBf16:
      return 2 * n;
    case Codec::kTopK:
    case Codec::kRandomK:
      return 4 + 8 * SparseCount(c.ratio, n);
    case Codec::kOneBit:
      return 4 * OneBitScales(n) + (n + 7) / 8;
  }
  return 0;
}

// |v| for ordering; a NaN sorts as the largest (and is sent).
float Magnitude(float v) {
  return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v);
}

// Writes the k indices in idx[0, k) (ascending) and their values of v.
void PutSparse(const float* v, const uint32_t* idx, size_t k, char** p) {
  Put<uint32_t>(p, static_cast<uint32_t>(k));
  if (k > 0) std::memcpy(*p, idx, 4 * k);
  *p += 4 * k;
  for (size_t j = 0; j < k; ++j) Put<float>(p, v[idx[j]]);
}

// onebit: per chunk, its mean magnitude s, then a bit a value (set: >= 0,
// sent as +s, else -s); r keeps what that leaves out.
void PutOneBit(float* r, size_t len, char** p) {
  char* scales = *p;
  char* bits = scales + 4 * OneBitScales(len);
  static_assert(kOneBitChunk % 8 == 0, "a chunk's signs are whole bytes");
  for (size_t c0 = 0; c0 < len; c0 += kOneBitChunk) {
    const size_t c1 = std::min(len, c0 + kOneBitChunk);
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // vectorizable partial sums
    size_t j = c0;
    for (; j + 8 <= c1; j += 8) {
      for (size_t t = 0; t < 8; ++t) lane[t] += std::fabs(r[j + t]);
    }
    double sum = 0;
    for (; j < c1; ++j) sum += std::fabs(r[j]);
    for (float x : lane) sum += x;
    const float scale = static_cast<float>(sum / static_cast<double>(c1 - c0));
    std::memcpy(scales + 4 * (c0 / kOneBitChunk), &scale, 4);
    for (j = c0; j < c1; j += 8) {  // c0 is a multiple of 8
      const size_t e = std::min(c1, j + 8);
      unsigned byte = 0;
      for (size_t t = j; t < e; ++t) {
        const bool up = r[t] >= 0;
        byte |= static_cast<unsigned>(up) << (t - j);
        r[t] -= up ? scale : -scale;
      }
      bits[j / 8] = static_cast<char>(byte);
    }
  }
  *p = bits + (len + 7) / 8;
}

// topk: the indices of the k largest magnitudes of r (ties: the lower
// index), ascending, in (*idx)[0, k). A sample of the magnitudes gives a
// threshold that about 2k of them pass; the k are picked among those (all
// of them when fewer than k pass).
void LargestK(const float* r, size_t len, size_t k, std::vector<uint32_t>* idx,
              std::vector<float>* mag) {
  mag->resize(len);
  for (size_t j = 0; j < len; ++j) (*mag)[j] = Magnitude(r[j]);
  const float* m = mag->data();
  auto larger = [m](uint32_t a, uint32_t b) {
    return m[a] > m[b] || (m[a] == m[b] && a < b);
  };
  idx->clear();
  constexpr size_t kSample = 512;
  if (k > 0 && 4 * k < len && len > 4 * kSample) {
    std::vector<float> sample(kSample);
    for (size_t i = 0; i < kSample; ++i) sample[i] = m[i * len / kSample];
    const size_t rank = std::min(kSample - 1, 2 * k * kSample / len + 1);
    std::nth_element(sample.begin(), sample.begin() + rank, sample.end(),
                     std::greater<float>());
    const float threshold = sample[rank];
    for (size_t j = 0; j < len; ++j) {
      if (m[j] >= threshold) idx->push_back(static_cast<uint32_t>(j));
    }
    // Every value left out is below the threshold, so below the k-th
    // largest of those kept: these k are the k largest of all.
    if (idx->size() < k) idx->clear();
  }
  if (idx->empty()) {
    idx->resize(len);
    std::iota(idx->begin(), idx->end(), 0u);
  }
  if (k < idx->size()) {
    std::nth_element(idx->begin(), idx->begin() + k, idx->end(), larger);
  }
}

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

}  // namespace

// ---- Codec and options ----

StatusOr<Codec> Codec::Parse(const std::string& text) {
  Codec c;
  const std::string accepted =
      "; accepted: none, fp16, bf16, onebit, topk:R, randomk:R (0 < R <= 1)";
  if (text == "none" || text.empty()) return c;
  if (text == "fp16") c.kind = kFp16;
  if (text == "bf16") c.kind = kBf16;
  if (text == "onebit") c.kind = kOneBit;
  if (c.kind != kNone) return c;
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  if (colon == std::string::npos || (name != "topk" && name != "randomk")) {
    return Status::InvalidArgument("unknown codec '" + text + "'" + accepted);
  }
  const std::string r = text.substr(colon + 1);
  char* end = nullptr;
  c.ratio = std::strtod(r.c_str(), &end);
  if (r.empty() || end != r.c_str() + r.size() || !(c.ratio > 0) ||
      c.ratio > 1) {
    return Status::InvalidArgument("codec '" + text + "': ratio '" + r +
                                   "' is not in (0, 1]");
  }
  c.kind = name == "topk" ? kTopK : kRandomK;
  return c;
}

std::string Codec::ToString() const {
  auto ratio_text = [this] {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", ratio);
    return std::string(buf);
  };
  switch (kind) {
    case kNone:
      return "none";
    case kFp16:
      return "fp16";
    case kBf16:
      return "bf16";
    case kTopK:
      return "topk:" + ratio_text();
    case kRandomK:
      return "randomk:" + ratio_text();
    case kOneBit:
      return "onebit";
  }
  return "?";
}

StatusOr<CompressOptions> CompressOptions::Parse(const std::string& text) {
  CompressOptions o;
  size_t begin = 0;
  bool first = true;
  while (begin <= text.size()) {
    size_t comma = text.find(',', begin);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(begin, comma - begin);
    begin = comma + 1;
    if (item.rfind("pull=", 0) == 0) {
      StatusOr<Codec> c = Codec::Parse(item.substr(5));
      if (!c.ok()) return c.status();
      o.pull = *c;
    } else if (item == "shared") {
      o.compress_shared = true;
    } else if (first) {
      StatusOr<Codec> c = Codec::Parse(item);
      if (!c.ok()) return c.status();
      o.push = *c;
    } else {
      return Status::InvalidArgument(
          "compression '" + text + "': unknown part '" + item +
          "' (accepted: CODEC[,pull=CODEC][,shared])");
    }
    first = false;
  }
  return o;
}

StatusOr<CompressOptions> CompressOptions::FromEnv() {
  const char* v = std::getenv("PS_COMPRESS");
  if (v == nullptr) return CompressOptions();
  StatusOr<CompressOptions> o = Parse(v);
  if (!o.ok()) {
    return Status::InvalidArgument(std::string("PS_COMPRESS='") + v +
                                   "': " + o.status().message());
  }
  return o;
}

bool CompressOptions::any() const {
  if (push.kind != Codec::kNone || pull.kind != Codec::kNone) return true;
  for (const RangeCodec& r : push_ranges) {
    if (r.push.kind != Codec::kNone) return true;
  }
  return false;
}

std::string CompressOptions::ToString() const {
  std::string s = push.ToString();
  if (pull.kind != Codec::kNone) s += ",pull=" + pull.ToString();
  if (compress_shared) s += ",shared";
  return s;
}

// ---- Compressor ----

struct Compressor::View {
  uint64_t version = 0;  // 0: none
  std::vector<float> values;
};

// A worker's request as a server sees it: (peer, customer, timestamp); and
// a worker's view of a key on a server: (peer, customer, key).
struct Id3 {
  int64_t a, b;
  uint64_t c;
  bool operator==(const Id3& o) const {
    return a == o.a && b == o.b && c == o.c;
  }
  bool operator<(const Id3& o) const {
    return a != o.a ? a < o.a : b != o.b ? b < o.b : c < o.c;
  }
};
struct Id3Hash {
  size_t operator()(const Id3& k) const {
    return std::hash<uint64_t>()(k.c * 1000003u + uint64_t(k.a) * 8191u +
                                 uint64_t(k.b));
  }
};

struct Compressor::Feedback {
  mutable Mutex mu;
  // A worker's push residuals, by key.
  std::unordered_map<uint64_t, std::vector<float>> residual GUARDED_BY(mu);
  std::mt19937_64 rng GUARDED_BY(mu);
  // Delta pulls. A worker's views of the weights, by key (made when it
  // first pulls the key). A server's view of each worker's, by (peer,
  // customer, key), and the versions each pull request in flight claims,
  // by (peer, customer, timestamp): its answer takes them away.
  std::unordered_map<uint64_t, View> views GUARDED_BY(mu);
  std::unordered_map<Id3, View, Id3Hash> peer_views GUARDED_BY(mu);
  std::map<Id3, std::unordered_map<uint64_t, uint64_t>> claims GUARDED_BY(mu);
  // Versions start at random: a restarted process never reuses one.
  uint64_t next_version GUARDED_BY(mu) =
      std::random_device()() | uint64_t{std::random_device()()} << 32;
  PullCounts pulls GUARDED_BY(mu);
  std::string versions_out GUARDED_BY(mu);  // scratch of EncodeValues

  // Encode's values part: the codecs, error feedback and views.
  Status EncodeValues(const Compressor& compressor, const FilterContext& ctx,
                      KVFrames* frames, std::string* note) REQUIRES(mu);
};

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

namespace {

// Note parts (its first byte says which follow, in this order).
constexpr uint8_t kValuesPart = 1;    // u64 values, u32 runs, (u32, u8) runs
constexpr uint8_t kClaimsPart = 2;    // u64 a key: the version a worker holds
constexpr uint8_t kVersionsPart = 4;  // (u64 base, u64 new) a key
constexpr uint8_t kDelta = 0x80;      // in a run's kind: a delta pull

// One key's segment of n values in codec c. For the feedback codecs `r`
// holds what is to be sent and keeps, after the call, what was not;
// otherwise `v` is sent as it is.
void PutSegment(const Codec& c, const float* v, float* r, size_t len,
                std::mt19937_64* rng, std::vector<uint32_t>* idx,
                std::vector<float>* mag, char** p) {
  switch (c.kind) {
    case Codec::kNone:
      if (len > 0) std::memcpy(*p, v, 4 * len);
      *p += 4 * len;
      return;
    case Codec::kFp16:
    case Codec::kBf16:
      for (size_t j = 0; j < len; ++j) {
        Put<uint16_t>(
            p, c.kind == Codec::kFp16 ? FloatToHalf(v[j]) : FloatToBf16(v[j]));
      }
      return;
    case Codec::kOneBit:
      PutOneBit(r, len, p);
      return;
    case Codec::kTopK:
    case Codec::kRandomK:
      break;
  }
  // topk, randomk: k indices, ascending; what they carry leaves r.
  const size_t k = SparseCount(c.ratio, len);
  if (c.kind == Codec::kTopK) {
    LargestK(r, len, k, idx, mag);
  } else {
    idx->resize(len);
    std::iota(idx->begin(), idx->end(), 0u);
    for (size_t j = 0; j < k; ++j) {
      std::uniform_int_distribution<size_t> pick(j, len - 1);
      std::swap((*idx)[j], (*idx)[pick(*rng)]);
    }
  }
  std::sort(idx->begin(), idx->begin() + k);
  PutSparse(r, idx->data(), k, p);
  for (size_t j = 0; j < k; ++j) r[(*idx)[j]] = 0.0f;
}

// Reads one key's segment of len values in `kind` into o; an error names
// what is wrong.
Status GetSegment(Codec::Kind kind, size_t len, Reader* in, float* o) {
  switch (kind) {
    case Codec::kNone: {
      const char* b = in->Take(4 * len);
      if (b == nullptr) return Status::Corruption("values cut short");
      if (len > 0) std::memcpy(o, b, 4 * len);
      return Status::OK();
    }
    case Codec::kFp16:
    case Codec::kBf16: {
      const char* b = in->Take(2 * len);
      if (b == nullptr) return Status::Corruption("values cut short");
      for (size_t j = 0; j < len; ++j) {
        uint16_t h;
        std::memcpy(&h, b + 2 * j, 2);
        o[j] = kind == Codec::kFp16 ? HalfToFloat(h) : Bf16ToFloat(h);
      }
      return Status::OK();
    }
    case Codec::kTopK:
    case Codec::kRandomK: {
      uint32_t k;
      if (!in->Get(&k) || k > len) {
        return Status::Corruption("bad count of sparse values");
      }
      const char* ib = in->Take(4 * size_t{k});
      const char* vb = in->Take(4 * size_t{k});
      if (ib == nullptr || vb == nullptr) {
        return Status::Corruption("sparse values cut short");
      }
      std::fill(o, o + len, 0.0f);
      int64_t last = -1;
      for (size_t j = 0; j < k; ++j) {
        uint32_t at;
        std::memcpy(&at, ib + 4 * j, 4);
        if (at >= len || static_cast<int64_t>(at) <= last) {
          return Status::Corruption("sparse index " + std::to_string(at) +
                                    " out of order or range");
        }
        last = at;
        std::memcpy(&o[at], vb + 4 * j, 4);
      }
      return Status::OK();
    }
    case Codec::kOneBit: {
      const char* sb = in->Take(4 * OneBitScales(len));
      const char* bits = in->Take((len + 7) / 8);
      if (sb == nullptr || bits == nullptr) {
        return Status::Corruption("signs cut short");
      }
      for (size_t c0 = 0; c0 < len; c0 += kOneBitChunk) {
        const size_t c1 = std::min(len, c0 + kOneBitChunk);
        float scale;
        std::memcpy(&scale, sb + 4 * (c0 / kOneBitChunk), 4);
        const float neg = -scale;
        for (size_t j = c0; j < c1; j += 8) {  // c0 is a multiple of 8
          const unsigned byte = static_cast<unsigned char>(bits[j / 8]);
          const size_t e = std::min(c1, j + 8);
          for (size_t t = j; t < e; ++t) {
            o[t] = (byte >> (t - j)) & 1u ? scale : neg;
          }
        }
      }
      return Status::OK();
    }
  }
  return Status::Corruption("unknown codec " + std::to_string(kind));
}

template <typename T>
void Append(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

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
  const CompressOptions& opts = compressor.options();
  const size_t num_keys = frames->keys.size() / 8;
  const uint64_t num_values = frames->vals.size() / 4;
  std::vector<uint64_t> counts;
  Status st = CountsOf(*frames, num_keys, num_values, &counts);
  if (!st.ok()) return st;
  // Per key: its codec, and for a delta pull the worker's view of it on
  // this server (null: the whole values go, raw).
  // Delta answers go to a request that claimed versions (the worker
  // pulls deltas); to others, whole values.
  const Id3 request{ctx.peer, ctx.customer_id, uint64_t(ctx.timestamp)};
  std::unordered_map<uint64_t, uint64_t> claimed;
  bool answer_deltas = false;
  if (!ctx.request && opts.pull.feedback()) {
    auto it = claims.find(request);
    if (it != claims.end()) {
      claimed = std::move(it->second);
      claims.erase(it);
      answer_deltas = true;
    }
  }
  // The values as floats (aligned: a copy only if they are not).
  SArray<char> in = frames->vals;
  std::vector<float> aligned;
  const float* vals = reinterpret_cast<const float*>(in.data());
  if (reinterpret_cast<uintptr_t>(in.data()) % alignof(float) != 0) {
    aligned.resize(num_values);
    if (num_values > 0) std::memcpy(aligned.data(), in.data(), in.size());
    vals = aligned.data();
  }
  std::vector<const Codec*> codec(num_keys);
  std::vector<View*> view(num_keys, nullptr);
  const Codec raw;
  const Codec& pull = opts.pull.feedback() ? raw : opts.pull;
  bool any = answer_deltas;
  size_t bytes = 0;
  const float* scan = vals;
  for (size_t i = 0; i < num_keys; ++i) {
    const uint64_t key = KeyAt(*frames, i);
    codec[i] = ctx.request ? &compressor.PushCodecOf(key) : &pull;
    // A non-finite value travels whole, raw, and starts its key's
    // feedback afresh (a residual or view of inf would never recover).
    const bool finite = !codec[i]->feedback() && !answer_deltas
                            ? true
                            : std::all_of(scan, scan + counts[i], [](float x) {
                                return std::isfinite(x);
                              });
    scan += counts[i];
    if (!finite) {
      codec[i] = &raw;
      residual.erase(key);
    }
    if (answer_deltas) {
      View& w = peer_views[{ctx.peer, ctx.customer_id, key}];
      auto claim = claimed.find(key);
      const bool known = finite && claim != claimed.end() &&
                         claim->second != 0 && claim->second == w.version &&
                         w.values.size() == counts[i];
      codec[i] = known ? &opts.pull : &raw;
      if (known) view[i] = &w;
    }
    any |= codec[i]->kind != Codec::kNone;
    bytes += SegmentBytes(*codec[i], counts[i]);
  }
  if (!any) return Status::OK();

  note->at(0) = static_cast<char>(note->at(0) | kValuesPart);
  Append<uint64_t>(note, num_values);
  std::string runs;
  uint32_t num_runs = 0;
  for (size_t i = 0; i < num_keys;) {
    const uint8_t kind =
        static_cast<uint8_t>(codec[i]->kind | (view[i] ? kDelta : 0));
    uint32_t run = 1;
    while (i + run < num_keys &&
           static_cast<uint8_t>(codec[i + run]->kind |
                                (view[i + run] ? kDelta : 0)) == kind) {
      ++run;
    }
    Append<uint32_t>(&runs, run);
    runs.push_back(static_cast<char>(kind));
    ++num_runs;
    i += run;
  }
  Append<uint32_t>(note, num_runs);
  note->append(runs);

  SArray<char> out(bytes);
  char* p = out.data();
  std::vector<uint32_t> idx;
  std::vector<float> mag, r, sent;
  if (answer_deltas)
    note->at(0) = static_cast<char>(note->at(0) | kVersionsPart);
  for (size_t i = 0; i < num_keys; ++i) {
    const Codec& c = *codec[i];
    const size_t len = counts[i];
    const float* v = vals;
    vals += len;
    const uint64_t key = KeyAt(*frames, i);
    if (answer_deltas) {
      // A delta pull: what changed since the worker's view, with that
      // view's error feedback (what is not sent stays in weights - view);
      // the view then moves by exactly what the worker will add.
      View& w = peer_views[{ctx.peer, ctx.customer_id, key}];
      const uint64_t base = view[i] ? w.version : 0;
      char* at = p;
      if (view[i] != nullptr) {
        r.resize(len);
        for (size_t j = 0; j < len; ++j) r[j] = v[j] - w.values[j];
        PutSegment(c, v, r.data(), len, &rng, &idx, &mag, &p);
        sent.resize(len);
        Reader back(at, static_cast<size_t>(p - at));
        CHECK(GetSegment(c.kind, len, &back, sent.data()).ok());
        for (size_t j = 0; j < len; ++j) w.values[j] += sent[j];
      } else {
        PutSegment(c, v, nullptr, len, &rng, &idx, &mag, &p);
        w.values.assign(v, v + len);
        // A view of non-finite values is never built on: whole next time.
        if (!std::all_of(v, v + len,
                         [](float x) { return std::isfinite(x); })) {
          w.values.clear();
        }
      }
      w.version = next_version++;
      ++(view[i] ? pulls.delta_keys : pulls.whole_keys);
      Append<uint64_t>(&versions_out, base);
      Append<uint64_t>(&versions_out, w.version);
      continue;
    }
    if (!c.feedback()) {
      PutSegment(c, v, nullptr, len, &rng, &idx, &mag, &p);
      continue;
    }
    // Error feedback: the key's residual becomes what is to be sent
    // (residual + v), and after the send what was not sent of it.
    std::vector<float>& res = residual[key];
    if (res.size() != len) res.assign(len, 0.0f);
    for (size_t j = 0; j < len; ++j) res[j] += v[j];
    PutSegment(c, v, res.data(), len, &rng, &idx, &mag, &p);
  }
  CHECK_EQ(p, out.data() + out.size());
  if (answer_deltas) {
    note->append(versions_out);
    versions_out.clear();
  }
  frames->vals = out;
  return Status::OK();
}

Status Compressor::Decode(const FilterContext& ctx, const std::string& note,
                          KVFrames* frames) {
  if (frames->keys.size() % 8 != 0) {
    return Status::Corruption(std::to_string(frames->keys.size()) +
                              " bytes of keys");
  }
  const size_t num_keys = frames->keys.size() / 8;
  Reader nr(note.data(), note.size());
  uint8_t parts = 0;
  if (!nr.Get(&parts) || parts == 0 ||
      (parts & ~(kValuesPart | kClaimsPart | kVersionsPart)) != 0) {
    return Status::Corruption("note too short or of unknown parts");
  }
  if ((parts & kClaimsPart) && !(ctx.request && ctx.pull)) {
    return Status::Corruption("versions claimed by what is no pull request");
  }
  if ((parts & kVersionsPart) && !(!ctx.request && (parts & kValuesPart))) {
    return Status::Corruption("view versions on what is no pull answer");
  }
  Feedback& fb = *feedback_;
  MutexLock lock(&fb.mu);
  std::vector<uint8_t> kinds;
  uint64_t num_values = 0;
  if (parts & kValuesPart) {
    if (!frames->has_vals || frames->val_type != detail::kTypeFloat) {
      return Status::Corruption("compressed values without float values");
    }
    uint32_t num_runs = 0;
    if (!nr.Get(&num_values) || !nr.Get(&num_runs)) {
      return Status::Corruption("note too short");
    }
    if (num_values > options_.max_values) {
      return Status::Corruption(
          "the message decodes to " + std::to_string(num_values) +
          " values; at most " + std::to_string(options_.max_values) +
          " are taken");
    }
    kinds.reserve(num_keys);
    for (uint32_t i = 0; i < num_runs; ++i) {
      uint32_t run;
      uint8_t kind;
      if (!nr.Get(&run) || !nr.Get(&kind) ||
          (kind & ~kDelta) > Codec::kOneBit || run == 0 ||
          run > num_keys - kinds.size()) {
        return Status::Corruption("bad codec runs in the note");
      }
      kinds.insert(kinds.end(), run, kind);
    }
    if (kinds.size() != num_keys) {
      return Status::Corruption("the note names codecs of " +
                                std::to_string(kinds.size()) + " keys of " +
                                std::to_string(num_keys));
    }
  }
  if (parts & kClaimsPart) {
    // A pull request's versions, for this server's answer to it. Requests
    // that are never answered (refused, their worker gone) cannot grow
    // the table: past kMaxClaims requests the oldest go (answered whole).
    constexpr size_t kMaxClaims = 4096;
    std::unordered_map<uint64_t, uint64_t> claimed;
    for (size_t i = 0; i < num_keys; ++i) {
      uint64_t version;
      if (!nr.Get(&version)) return Status::Corruption("versions cut short");
      claimed[KeyAt(*frames, i)] = version;
    }
    while (fb.claims.size() >= kMaxClaims) fb.claims.erase(fb.claims.begin());
    fb.claims[{ctx.peer, ctx.customer_id, uint64_t(ctx.timestamp)}] =
        std::move(claimed);
  }
  std::vector<std::pair<uint64_t, uint64_t>> versions;
  if (parts & kVersionsPart) {
    versions.resize(num_keys);
    for (auto& v : versions) {
      if (!nr.Get(&v.first) || !nr.Get(&v.second)) {
        return Status::Corruption("versions cut short");
      }
    }
  }
  if (nr.left() != 0) {
    return Status::Corruption(std::to_string(nr.left()) +
                              " bytes after the note's parts");
  }
  if (!(parts & kValuesPart)) return Status::OK();

  std::vector<uint64_t> counts;
  Status st = CountsOf(*frames, num_keys, num_values, &counts);
  if (!st.ok()) return st;
  // The bytes the codecs need at least, before anything is allocated.
  uint64_t least = 0;
  for (size_t i = 0; i < num_keys; ++i) {
    const Codec::Kind kind = static_cast<Codec::Kind>(kinds[i] & ~kDelta);
    Codec c;
    c.kind = kind;
    least += kind == Codec::kTopK || kind == Codec::kRandomK
                 ? 4
                 : SegmentBytes(c, counts[i]);
  }
  if (least > frames->vals.size()) {
    return Status::Corruption("the note's codecs need at least " +
                              std::to_string(least) +
                              " bytes of values; the message has " +
                              std::to_string(frames->vals.size()));
  }
  SArray<char> out(4 * num_values);
  float* o = reinterpret_cast<float*>(out.data());
  Reader in(frames->vals.data(), frames->vals.size());
  for (size_t i = 0; i < num_keys; ++i) {
    const std::string where =
        " (key " + std::to_string(KeyAt(*frames, i)) + ")";
    const bool delta = (kinds[i] & kDelta) != 0;
    if (delta) {
      // A delta moves this worker's view of the key, from the version the
      // view is at.
      auto it =
          versions.empty() ? fb.views.end() : fb.views.find(KeyAt(*frames, i));
      if (it == fb.views.end() || it->second.version != versions[i].first ||
          it->second.values.size() != counts[i]) {
        return Status::Corruption(
            "a delta from version " +
            (versions.empty() ? "?" : std::to_string(versions[i].first)) +
            " of a view at version " +
            (it == fb.views.end() ? "none"
                                  : std::to_string(it->second.version)) +
            where);
      }
    }
    st = GetSegment(static_cast<Codec::Kind>(kinds[i] & ~kDelta), counts[i],
                    &in, o);
    if (!st.ok()) return Status::Corruption(st.message() + where);
    o += counts[i];
  }
  if (in.left() != 0) {
    return Status::Corruption(std::to_string(in.left()) +
                              " bytes after the last key's values");
  }
  // All of it read and checked: now the views change (a delta adds to its
  // view, whole values replace it) and the pull gets them.
  o = reinterpret_cast<float*>(out.data());
  for (size_t i = 0; i < num_keys && !versions.empty(); ++i) {
    const size_t len = counts[i];
    View& view = fb.views[KeyAt(*frames, i)];
    if (kinds[i] & kDelta) {
      for (size_t j = 0; j < len; ++j) view.values[j] += o[j];
      if (len > 0) std::memcpy(o, view.values.data(), 4 * len);
    } else {
      view.values.assign(o, o + len);
    }
    view.version = versions[i].second;
    o += len;
  }
  frames->vals = out;
  return Status::OK();
}

std::string Compressor::SaveState() const {
  MutexLock lock(&feedback_->mu);
  std::string s;
  auto put = [&s](const void* p, size_t n) {
    s.append(static_cast<const char*>(p), n);
  };
  const uint64_t n = feedback_->residual.size();
  put(&n, 8);
  // In key order, so that the same state gives the same bytes.
  std::vector<uint64_t> keys;
  for (const auto& kv : feedback_->residual) keys.push_back(kv.first);
  std::sort(keys.begin(), keys.end());
  for (uint64_t key : keys) {
    const std::vector<float>& r = feedback_->residual.at(key);
    const uint64_t len = r.size();
    put(&key, 8);
    put(&len, 8);
    put(r.data(), 4 * r.size());
  }
  return s;
}

Status Compressor::RestoreState(const std::string& state) {
  if (state.empty()) {  // nothing kept (a job that compressed nothing)
    MutexLock lock(&feedback_->mu);
    feedback_->residual.clear();
    return Status::OK();
  }
  Reader in(state.data(), state.size());
  uint64_t n;
  if (!in.Get(&n)) return Status::Corruption("compression state: too short");
  std::unordered_map<uint64_t, std::vector<float>> residual;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t key, len;
    if (!in.Get(&key) || !in.Get(&len) || len > in.left() / 4) {
      return Status::Corruption("compression state: entry " +
                                std::to_string(i) + " of " + std::to_string(n) +
                                " cut short");
    }
    std::vector<float>& r = residual[key];
    r.resize(len);
    if (len > 0) std::memcpy(r.data(), in.Take(4 * len), 4 * len);
  }
  if (in.left() != 0) {
    return Status::Corruption(
        "compression state: " + std::to_string(in.left()) + " bytes too many");
  }
  MutexLock lock(&feedback_->mu);
  feedback_->residual = std::move(residual);
  return Status::OK();
}

Compressor::PullCounts Compressor::pull_counts() const {
  MutexLock lock(&feedback_->mu);
  return feedback_->pulls;
}

std::vector<float> Compressor::Residual(uint64_t key) const {
  MutexLock lock(&feedback_->mu);
  auto it = feedback_->residual.find(key);
  return it == feedback_->residual.end() ? std::vector<float>() : it->second;
}

}  // namespace ps
