// The byte layouts the fuzz targets read and fuzz_seeds writes: one encoded
// message (header + data frames) in a single buffer, and (below) one codec
// segment for fuzz_codecs.
//
//   byte 0        frame count n (taken modulo kMaxFrames + 1)
//   2 bytes       header length, little endian
//   2n bytes      the n frame lengths, little endian
//   then          the header bytes, then each frame's bytes in order
//
// A length running past the end of the input is cut to what is left, so
// every input is a message; the fuzzer mutates lengths and bytes alike.
#ifndef PS_TESTS_FUZZ_FUZZ_INPUT_H_
#define PS_TESTS_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ps/sarray.h"

namespace ps::fuzz {

constexpr size_t kMaxFrames = 8;

// The key that fuzz_open opens with and fuzz_seeds seals its seeds with.
inline const std::string kFuzzSealKey(32, 'f');

struct FuzzMessage {
  std::string header;
  // Each frame in its own allocation of exactly its size, so that
  // AddressSanitizer catches a read one past its end.
  std::vector<SArray<char>> frames;
};

inline FuzzMessage ParseFuzzInput(const uint8_t* data, size_t size) {
  FuzzMessage m;
  size_t pos = 0;
  auto take_u16 = [&]() -> size_t {
    size_t v = 0;
    if (pos < size) v |= data[pos++];
    if (pos < size) v |= static_cast<size_t>(data[pos++]) << 8;
    return v;
  };
  const size_t n = pos < size ? data[pos++] % (kMaxFrames + 1) : 0;
  const size_t header_size = take_u16();
  std::vector<size_t> frame_sizes(n);
  for (size_t& s : frame_sizes) s = take_u16();
  auto take_bytes = [&](size_t want) {
    size_t got = std::min(want, size - pos);
    const uint8_t* start = data + pos;
    pos += got;
    return std::make_pair(start, got);
  };
  auto [h, hn] = take_bytes(header_size);
  m.header.assign(reinterpret_cast<const char*>(h), hn);
  for (size_t s : frame_sizes) {
    auto [f, fn] = take_bytes(s);
    SArray<char> frame(fn);
    if (fn > 0) std::memcpy(frame.data(), f, fn);
    m.frames.push_back(frame);
  }
  return m;
}

// The inverse, for writing seeds; sizes must fit in 16 bits.
inline std::string SerializeFuzzInput(const std::string& header,
                                      const std::vector<SArray<char>>& frames) {
  std::string out;
  auto put_u16 = [&](size_t v) {
    out.push_back(static_cast<char>(v & 0xff));
    out.push_back(static_cast<char>((v >> 8) & 0xff));
  };
  out.push_back(static_cast<char>(frames.size()));
  put_u16(header.size());
  for (const auto& f : frames) put_u16(f.size());
  out += header;
  for (const auto& f : frames) out.append(f.data(), f.size());
  return out;
}

// fuzz_codecs' layout: one key's segment under one codec (src/kv/codecs.h).
//
//   byte 0        mode: even, the rest decoded as a segment; odd, the rest's
//                 floats encoded and decoded back
//   byte 1        codec kind (decode: modulo 8, so 6 and 7 are unknown;
//                 round trip: modulo 6)
//   2 bytes       count of values, little endian, modulo kMaxCodecValues + 1
//   byte 4        ratio of topk and randomk: (byte + 1) / 256
//   byte 5        seed of randomk's draws
//   then          the segment's bytes (decode), or the floats (round trip:
//                 repeated up to the count; zeros under 4 bytes)
//
// A short input reads zeros for the bytes it lacks.
constexpr size_t kMaxCodecValues = 4096;

struct CodecInput {
  uint8_t mode = 0, kind = 0;
  size_t count = 0;
  uint8_t ratio = 0, seed = 0;
  std::string rest;
};

inline CodecInput ParseCodecInput(const uint8_t* data, size_t size) {
  auto at = [&](size_t i) -> uint8_t { return i < size ? data[i] : 0; };
  CodecInput in;
  in.mode = at(0);
  in.kind = at(1);
  in.count = (at(2) | static_cast<size_t>(at(3)) << 8) % (kMaxCodecValues + 1);
  in.ratio = at(4);
  in.seed = at(5);
  if (size > 6)
    in.rest.assign(reinterpret_cast<const char*>(data + 6), size - 6);
  return in;
}

// The inverse, for writing seeds; count must be at most kMaxCodecValues.
inline std::string SerializeCodecInput(const CodecInput& in) {
  std::string out;
  for (size_t v : {size_t{in.mode}, size_t{in.kind}, in.count & 0xff,
                   in.count >> 8, size_t{in.ratio}, size_t{in.seed}}) {
    out.push_back(static_cast<char>(v));
  }
  return out + in.rest;
}

}  // namespace ps::fuzz

#endif  // PS_TESTS_FUZZ_FUZZ_INPUT_H_
