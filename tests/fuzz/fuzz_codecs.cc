// libFuzzer target: the pure codecs (src/kv/codecs.h), in the layout of
// fuzz_input.h (CodecInput), two ways.
//   Decode: arbitrary bytes as one key's segment of each codec kind and
//   count (unknown kinds too). It returns an error, or floats having read
//   exactly the segment's bytes, each float what the bytes say (a half's
//   and a bf16's value, +-a onebit scale, a sparse value at its index and
//   zeros elsewhere); never a read past the bytes (each input in its own
//   allocation of exactly its size, for ASan) nor a write past the count.
//   Round trip: the input's floats encoded, in a buffer of exactly
//   SegmentBytes, then decoded, checking what each codec promises: none,
//   every bit; fp16 and bf16, exactly the nearest-even rounding of each
//   value (computed here in double, apart from the codec); topk, the k
//   largest magnitudes (ties: the lower index) exact, zeros elsewhere;
//   randomk, k distinct values exact; onebit, each value's sign and its
//   chunk's mean magnitude. The feedback codecs' residual keeps exactly
//   what was not sent.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_input.h"
#include "kv/codecs.h"

namespace ps {
namespace {

void Require(bool ok) {
  if (!ok) std::abort();
}

uint32_t Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

// Bit for bit, any NaN equal to any NaN.
bool Same(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || Bits(a) == Bits(b);
}

// v rounded to nearest-even with `bits` bits after the point, exponents
// from `min_exp` (below: a fixed step, as subnormals), `max` the largest
// finite value (beyond: infinity).
float RoundTo(float v, int bits, int min_exp, double max, double overflow) {
  if (std::isnan(v) || std::isinf(v)) return v;
  const double a = std::fabs(static_cast<double>(v));
  if (a >= overflow) return std::copysign(INFINITY, v);
  int e;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  const double step = std::ldexp(1.0, std::max(e - 1, min_exp) - bits);
  const double r = std::nearbyint(a / step) * step;
  if (r > max) return std::copysign(INFINITY, v);
  return static_cast<float>(std::copysign(r, static_cast<double>(v)));
}

float RefHalf(float v) { return RoundTo(v, 10, -14, 65504.0, 65520.0); }
float RefBf16(float v) {
  return RoundTo(v, 7, -126, static_cast<double>(FLT_MAX), INFINITY);
}

// The half's and bf16's values, apart from the codec.
float HalfValue(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 31) return m ? NAN : (h & 0x8000 ? -INFINITY : INFINITY);
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                           : std::ldexp(static_cast<float>(1024 + m), e - 25);
  return h & 0x8000 ? -mag : mag;
}

std::vector<uint16_t> U16s(const char* p, size_t n) {
  std::vector<uint16_t> v(n);
  if (n > 0) std::memcpy(v.data(), p, 2 * n);
  return v;
}

// A sparse segment at p: its k indices and k values.
void ReadSparse(const char* p, std::vector<uint32_t>* idx,
                std::vector<float>* vals) {
  uint32_t k;
  std::memcpy(&k, p, 4);
  idx->resize(k);
  vals->resize(k);
  if (k == 0) return;
  std::memcpy(idx->data(), p + 4, 4 * size_t{k});
  std::memcpy(vals->data(), p + 4 + 4 * size_t{k}, 4 * size_t{k});
}

// The floats at index[j] are vals[j], all others +0.
void CheckSparse(const std::vector<float>& out,
                 const std::vector<uint32_t>& idx,
                 const std::vector<float>& vals) {
  std::vector<bool> sent(out.size(), false);
  for (size_t j = 0; j < idx.size(); ++j) {
    Require(Same(out[idx[j]], vals[j]));
    sent[idx[j]] = true;
  }
  for (size_t i = 0; i < out.size(); ++i) Require(sent[i] || Bits(out[i]) == 0);
}

// onebit: value t is +-its chunk's scale, + where its sign bit is set.
void CheckOneBit(const std::vector<float>& out, const char* seg) {
  const size_t n = out.size();
  const char* bits = seg + 4 * OneBitScales(n);
  for (size_t t = 0; t < n; ++t) {
    float scale;
    std::memcpy(&scale, seg + 4 * (t / kOneBitChunk), 4);
    const bool up = (static_cast<unsigned char>(bits[t / 8]) >> (t % 8)) & 1u;
    Require(Bits(out[t]) == Bits(up ? scale : -scale));
  }
}

void DecodeArbitrary(const fuzz::CodecInput& in) {
  const auto kind = static_cast<Codec::Kind>(in.kind % 8);
  const size_t n = in.count;
  std::vector<char> bytes(in.rest.begin(), in.rest.end());  // exactly sized
  const char none = 0;
  const char* p = bytes.empty() ? &none : bytes.data();
  std::vector<float> out(n);
  Reader reader(p, bytes.size());
  if (!GetSegment(kind, n, &reader, out.data()).ok()) return;
  Require(kind <= Codec::kOneBit);
  const size_t read = bytes.size() - reader.left();
  Codec c;
  c.kind = kind;
  std::vector<uint32_t> idx;
  std::vector<float> vals;
  switch (kind) {
    case Codec::kNone:
      Require(read == 4 * n);
      Require(n == 0 || std::memcmp(out.data(), p, 4 * n) == 0);
      return;
    case Codec::kFp16:
    case Codec::kBf16: {
      Require(read == 2 * n);
      const std::vector<uint16_t> h = U16s(p, n);
      for (size_t j = 0; j < n; ++j) {
        const bool half = kind == Codec::kFp16;
        if (half) Require(Same(out[j], HalfValue(h[j])));
        if (!half) Require(Bits(out[j]) == static_cast<uint32_t>(h[j]) << 16);
        // A value decoded encodes to its bits again (a NaN: quiet).
        const uint16_t again = half ? FloatToHalf(out[j]) : FloatToBf16(out[j]);
        const uint16_t quiet = half ? 0x200 : 0x40;
        Require(again == (std::isnan(out[j]) ? h[j] | quiet : h[j]));
      }
      return;
    }
    case Codec::kTopK:
    case Codec::kRandomK:
      ReadSparse(p, &idx, &vals);
      Require(idx.size() <= n && read == 4 + 8 * idx.size());
      CheckSparse(out, idx, vals);
      return;
    case Codec::kOneBit:
      Require(read == SegmentBytes(c, n));
      CheckOneBit(out, p);
      return;
  }
}

// Whether value a sorts before value b among the largest magnitudes (a NaN
// as infinity; ties: the lower index).
bool Before(const std::vector<float>& v, uint32_t a, uint32_t b) {
  auto mag = [](float x) { return std::isnan(x) ? INFINITY : std::fabs(x); };
  const float ma = mag(v[a]), mb = mag(v[b]);
  return ma > mb || (ma == mb && a < b);
}

// topk, randomk: k = SparseCount values sent exactly, the residual r keeps
// every other value and holds 0 where one was sent; topk's are the largest.
void CheckSparseTrip(const Codec& c, const std::vector<float>& v,
                     const std::vector<float>& r, const std::vector<float>& out,
                     const char* seg) {
  std::vector<uint32_t> idx;
  std::vector<float> vals;
  ReadSparse(seg, &idx, &vals);
  Require(idx.size() == SparseCount(c.ratio, v.size()));
  CheckSparse(out, idx, vals);
  std::vector<bool> sent(v.size(), false);
  for (uint32_t j : idx) {
    Require(Same(out[j], v[j]) && Bits(r[j]) == 0);
    sent[j] = true;
  }
  // The last sent and the first left out in the order of Before.
  int64_t last_sent = -1, first_left = -1;
  for (uint32_t i = 0; i < v.size(); ++i) {
    if (!sent[i]) Require(Same(r[i], v[i]));
    int64_t& mark = sent[i] ? last_sent : first_left;
    const bool replace = sent[i] ? mark < 0 || Before(v, uint32_t(mark), i)
                                 : mark < 0 || Before(v, i, uint32_t(mark));
    if (replace) mark = i;
  }
  if (c.kind == Codec::kTopK && last_sent >= 0 && first_left >= 0) {
    Require(Before(v, uint32_t(last_sent), uint32_t(first_left)));
  }
}

// onebit: each chunk's scale is its mean magnitude (within the rounding of
// its float partial sums), each value's sign is kept, and r keeps v - sent.
void CheckOneBitTrip(const std::vector<float>& v, const std::vector<float>& r,
                     const std::vector<float>& out, const char* seg) {
  CheckOneBit(out, seg);
  for (size_t c0 = 0; c0 < v.size(); c0 += kOneBitChunk) {
    const size_t c1 = std::min(v.size(), c0 + kOneBitChunk);
    float scale;
    std::memcpy(&scale, seg + 4 * (c0 / kOneBitChunk), 4);
    double sum = 0;
    bool nan = false;
    for (size_t t = c0; t < c1; ++t) {
      nan |= std::isnan(v[t]);
      sum += std::fabs(static_cast<double>(v[t]));
      Require(Bits(out[t]) == Bits(v[t] >= 0 ? scale : -scale));
      Require(Same(r[t], v[t] - out[t]));
    }
    const double mean = sum / static_cast<double>(c1 - c0);
    if (nan) {
      Require(std::isnan(scale));
    } else if (std::isinf(sum)) {
      Require(std::isinf(scale) && scale > 0);
    } else if (sum <= 1e37) {  // no float partial sum overflows
      Require(std::fabs(scale - mean) <= 1e-5 * mean + 0x1p-140);
    }
  }
}

void RoundTrip(const fuzz::CodecInput& in) {
  Codec c;
  c.kind = static_cast<Codec::Kind>(in.kind % 6);
  c.ratio = (in.ratio + 1) / 256.0;
  const size_t n = in.count, given = in.rest.size() / 4;
  std::vector<float> v(n, 0.0f);
  for (size_t j = 0; j < n && given > 0; ++j) {
    std::memcpy(&v[j], in.rest.data() + 4 * (j % given), 4);
  }
  std::vector<char> seg(SegmentBytes(c, n));  // exactly sized
  std::vector<float> r = v;
  std::mt19937_64 rng(in.seed);
  SegmentScratch scratch;
  char* p = seg.data();
  PutSegment(c, v.data(), c.feedback() ? r.data() : nullptr, n, &rng, &scratch,
             &p);
  Require(p == seg.data() + seg.size());
  std::vector<float> out(n);
  const char none = 0;
  Reader reader(seg.empty() ? &none : seg.data(), seg.size());
  Require(GetSegment(c.kind, n, &reader, out.data()).ok());
  Require(reader.left() == 0);
  for (size_t j = 0; j < n; ++j) {
    if (c.kind == Codec::kNone) Require(Bits(out[j]) == Bits(v[j]));
    if (c.kind == Codec::kFp16) Require(Same(out[j], RefHalf(v[j])));
    if (c.kind == Codec::kBf16) Require(Same(out[j], RefBf16(v[j])));
  }
  if (c.kind == Codec::kTopK || c.kind == Codec::kRandomK) {
    CheckSparseTrip(c, v, r, out, seg.data());
  }
  if (c.kind == Codec::kOneBit) CheckOneBitTrip(v, r, out, seg.data());
}

}  // namespace
}  // namespace ps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ps::fuzz::CodecInput in = ps::fuzz::ParseCodecInput(data, size);
  if (in.mode % 2 == 0) {
    ps::DecodeArbitrary(in);
  } else {
    ps::RoundTrip(in);
  }
  return 0;
}
