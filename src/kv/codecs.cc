// The pure float codecs (codecs.h): conversions and one key's segment to
// bytes and back.
#include "kv/codecs.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

namespace ps {

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

size_t SparseCount(double ratio, size_t n) {
  if (n == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  return std::min(n, std::max<size_t>(1, static_cast<size_t>(k)));
}

size_t OneBitScales(size_t n) { return (n + kOneBitChunk - 1) / kOneBitChunk; }

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

float Magnitude(float v) {
  return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v);
}

void PutSparse(const float* v, const uint32_t* idx, size_t k, char** p) {
  Put<uint32_t>(p, static_cast<uint32_t>(k));
  if (k > 0) std::memcpy(*p, idx, 4 * k);
  *p += 4 * k;
  for (size_t j = 0; j < k; ++j) Put<float>(p, v[idx[j]]);
}

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

// A sample of the magnitudes gives a threshold that about 2k of them pass;
// the k are picked among those (all of them when fewer than k pass).
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

void PutSegment(const Codec& c, const float* v, float* r, size_t len,
                std::mt19937_64* rng, SegmentScratch* scratch, char** p) {
  std::vector<uint32_t>* idx = &scratch->idx;
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
    LargestK(r, len, k, idx, &scratch->mag);
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

namespace {

// topk, randomk: k, the k indices (ascending, below len), the k values.
Status GetSparse(size_t len, Reader* in, float* o) {
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

// onebit: the scales, then the signs; value j is +-its chunk's scale.
Status GetOneBit(size_t len, Reader* in, float* o) {
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

}  // namespace

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
    case Codec::kRandomK:
      return GetSparse(len, in, o);
    case Codec::kOneBit:
      return GetOneBit(len, in, o);
  }
  return Status::Corruption("unknown codec " + std::to_string(kind));
}

}  // namespace ps
