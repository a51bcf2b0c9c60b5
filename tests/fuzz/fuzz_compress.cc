// libFuzzer target: ps::Compressor::Decode (ps/compress.h) on arbitrary
// bytes, two ways. Raw: the input cut into a note, keys, lens and values,
// decoded by a server's compressor (a request) and a worker's (an answer,
// delta pulls on). Damaged: a message the input describes (codec, values)
// encoded for real, then bytes of its note and values overwritten as the
// input says, and decoded. Nothing may crash or read out of bounds (ASan),
// and whatever decodes has exactly the values its note announced.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ps/compress.h"

namespace {

std::shared_ptr<ps::Compressor> Make(const char* text) {
  ps::CompressOptions o = *ps::CompressOptions::Parse(text);
  o.max_values = 1 << 20;  // a sparse message may decode to this many
  return *ps::Compressor::Make(o);
}

// Decodes and checks what came out against the note's count of values.
void Check(ps::Compressor* c, const ps::FilterContext& ctx,
           const std::string& note, ps::KVFrames f) {
  if (!c->Decode(ctx, note, &f).ok()) return;
  uint64_t values = 0;
  if (note.size() >= 9 && (note[0] & 1)) std::memcpy(&values, &note[1], 8);
  if ((note[0] & 1) && f.vals.size() != 4 * values) std::abort();
}

class Input {
 public:
  Input(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint8_t Byte() { return at_ < n_ ? d_[at_++] : 0; }
  std::string Bytes(size_t n) {
    n = std::min(n, n_ - at_);
    std::string s(reinterpret_cast<const char*>(d_ + at_), n);
    at_ += n;
    return s;
  }
  std::string Rest() { return Bytes(n_ - at_); }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t at_ = 0;
};

ps::SArray<char> Chars(const std::string& s) {
  ps::SArray<char> a(s.size());
  if (!s.empty()) std::memcpy(a.data(), s.data(), s.size());
  return a;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto server = Make("none,pull=onebit");
  static auto worker = Make("topk:0.5,pull=topk:0.5");
  Input in(data, size);
  const uint8_t mode = in.Byte();
  ps::FilterContext request, answer;
  request.push = request.pull = true;
  request.peer = 9;
  answer.request = false;
  answer.pull = true;
  answer.peer = 8;
  if (mode % 2 == 0) {  // raw
    const size_t num_keys = in.Byte() % 8 + 1;
    ps::KVFrames f;
    f.keys = Chars(in.Bytes(8 * num_keys));
    f.has_lens = in.Byte() & 1;
    if (f.has_lens) f.lens = Chars(in.Bytes(4 * num_keys));
    const std::string note = in.Bytes(in.Byte());
    f.has_vals = true;
    f.val_type = 9;
    f.vals = Chars(in.Rest());
    if (note.empty()) return 0;
    Check(server.get(), request, note, f);
    Check(worker.get(), answer, note, f);
    return 0;
  }
  // Damaged: n floats of the input under one of the codecs, then overwrites.
  static const char* const kCodecs[] = {"fp16",   "bf16",        "topk:0.1",
                                        "onebit", "randomk:0.3", "none"};
  auto encoder = Make(kCodecs[in.Byte() % 6]);
  const size_t n = in.Byte() % 64 + 1;
  std::vector<float> vals(n);
  const std::string raw = in.Bytes(4 * n);
  std::memcpy(vals.data(), raw.data(), raw.size());
  ps::KVFrames f;
  const uint64_t keys[2] = {1, 2};
  const int32_t lens[2] = {static_cast<int32_t>(n / 2),
                           static_cast<int32_t>(n - n / 2)};
  f.keys = Chars(std::string(reinterpret_cast<const char*>(keys), 16));
  f.lens = Chars(std::string(reinterpret_cast<const char*>(lens), 8));
  f.has_lens = f.has_vals = true;
  f.val_type = 9;
  f.vals =
      Chars(std::string(reinterpret_cast<const char*>(vals.data()), 4 * n));
  std::string note;
  ps::FilterContext push;
  push.push = true;
  if (!*encoder->Encode(push, &f, &note)) return 0;
  std::string bytes(f.vals.data(), f.vals.size());
  for (int i = 0; i < 4; ++i) {
    const uint8_t where = in.Byte(), what = in.Byte();
    if (where & 1) {
      note[where / 2 % note.size()] = static_cast<char>(what);
    } else if (!bytes.empty()) {
      bytes[where / 2 % bytes.size()] = static_cast<char>(what);
    }
  }
  f.vals = Chars(bytes);
  Check(server.get(), push, note, f);
  return 0;
}
