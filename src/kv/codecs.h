// The float codecs of ps/compress.h as pure functions: one key's segment of
// n values to bytes and back, with no message, filter note or state. An
// encoder writes into a buffer of SegmentBytes(c, n) bytes; a decoder reads
// from a bounded Reader and, on bad bytes, returns a Status naming what is
// wrong (it never reads past the Reader's end, nor writes past n floats).
//
// A segment of n values, by codec:
//   none          n floats
//   fp16, bf16    n uint16
//   topk, randomk uint32 k, k uint32 indices (ascending), k floats
//   onebit        ceil(n / kOneBitChunk) float scales, ceil(n / 8) bytes of
//                 signs (bit j % 8 of byte j / 8: value j >= 0)
// All integers and floats little-endian, as the hosts that run this.
//
// Thread-safety: the functions share nothing; a Reader is one caller's.
#ifndef PS_KV_CODECS_H_
#define PS_KV_CODECS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ps/compress.h"
#include "ps/status.h"

namespace ps {

// IEEE binary16 from a float, rounded to nearest-even (from 65520 up:
// infinity; NaN stays NaN, its payload's top bits kept), and back.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
// bfloat16: the upper half of a float, rounded to nearest-even (NaN stays
// NaN), and back.
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);

// Little-endian writes over a byte buffer the caller sized.
template <typename T>
void Put(char** p, T v) {
  std::memcpy(*p, &v, sizeof(T));
  *p += sizeof(T);
}

// And appended to a string.
template <typename T>
void Append(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Bounded reads over n bytes at p (not owned: they outlive the Reader).
class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), end_(p + n) {}
  // False, reading nothing, if fewer than sizeof(T) bytes are left.
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

// topk, randomk: how many of n values a key sends, ceil(ratio n) in [1, n]
// (0 for n = 0).
size_t SparseCount(double ratio, size_t n);
// onebit: the scales of n values.
size_t OneBitScales(size_t n);
// The bytes of one key's segment of n values in codec c.
size_t SegmentBytes(const Codec& c, size_t n);

// |v| for ordering; a NaN sorts as the largest (and is sent).
float Magnitude(float v);
// Writes the k indices in idx[0, k) (ascending) and their values of v.
void PutSparse(const float* v, const uint32_t* idx, size_t k, char** p);
// onebit: per chunk, its mean magnitude s, then a bit a value (set: >= 0,
// sent as +s, else -s); r keeps what that leaves out.
void PutOneBit(float* r, size_t len, char** p);
// topk: the indices of the k largest magnitudes of r (ties: the lower
// index), in (*idx)[0, k), in no order; `mag` is scratch.
void LargestK(const float* r, size_t len, size_t k, std::vector<uint32_t>* idx,
              std::vector<float>* mag);

// What PutSegment reuses between keys (no state: only its capacity stays).
struct SegmentScratch {
  std::vector<uint32_t> idx;
  std::vector<float> mag;
};

// One key's segment of len values in codec c, at *p (advanced past it). For
// the feedback codecs `r` holds what is to be sent and keeps, after the
// call, what was not (randomk draws its indices from `rng`); otherwise `v`
// is sent as it is.
void PutSegment(const Codec& c, const float* v, float* r, size_t len,
                std::mt19937_64* rng, SegmentScratch* scratch, char** p);

// Reads one key's segment of len values in `kind` into o[0, len); an error
// names what is wrong (o may then be partly written).
Status GetSegment(Codec::Kind kind, size_t len, Reader* in, float* o);

}  // namespace ps

#endif  // PS_KV_CODECS_H_
