// Compression of float values on the wire: a filter (ps/filter.h) that a
// worker and its servers add to their chains, with a codec for the pushed
// gradients and one for the pulled weights.
//
//   auto c = ps::Compressor::Make(*ps::CompressOptions::Parse("topk:0.01"));
//   worker.AddFilter(*c);  server.AddFilter(*ps::Compressor::Make(options));
//
// The codecs (Codec::Parse names them):
//   fp16, bf16   every value rounded to nearest-even in 16 bits (bf16: the
//                upper half of the float; fp16: IEEE half, values beyond
//                65504 become infinities, below 2^-24 zero): half the bytes.
//   topk:R       per key, the ceil(R n) values of largest magnitude, as
//                (index, value) pairs: 8 bytes each.
//   randomk:R    per key, ceil(R n) values at indices drawn at random.
//   onebit       per key, one bit a value (its sign) and one scale per
//                chunk of kOneBitChunk values (their mean magnitude), as
//                1-bit SGD and BytePS's onebit.
// topk, randomk and onebit keep error feedback on the worker: what a push
// did not carry of a key's values is kept and added to that key's next
// push, so nothing is lost, only delayed (SaveState/RestoreState take it
// into a checkpoint). The server decodes to float32 before its handle sums
// and applies: the optimizer never sees a compressed value.
//
// Pull answers use `pull`. fp16 and bf16 round the weights afresh with
// every pull. onebit, topk and randomk send deltas: the server keeps, per
// worker and key, the worker's view of the weights (what it has sent it)
// and answers with codec(weights - view), moving the view by exactly what
// the worker adds to its own copy, so what is not sent stays in weights -
// view and goes later (error feedback on the server). Views carry
// versions: a pull request names the version the worker holds of each key,
// and a server that does not hold that very version (the first pull, a
// lost answer, a resent request, a replica that took over, a restarted
// process) answers with the whole values, raw, instead. One pull of a key
// at a time per worker: a delta that does not start from the worker's
// version fails that pull, naming the versions. Views are not in
// checkpoints: after --restore the first pull is whole.
//
// What is not compressed: values of other types than float, messages
// without values, and, unless compress_shared, everything to or from a
// peer reached through shared memory (same host, PS_SHM): its values
// travel by reference, so compressing them would only cost time. The
// decoder reads any codec the note on a message names, so a server serves
// workers of different codecs.
//
// Each message's codec per key travels in its filter note, the key's
// segment carries its own sizes, and Decode checks every size and index
// against the message (a malformed one is refused naming what is wrong).
// Resent messages carry the bytes of their first encoding (the worker keeps
// the filtered message), so error feedback is applied once per push; a push
// whose send fails at once (too large, no connection) fails its request,
// and what it carried is not kept. A push holding a NaN or an infinity goes
// whole (raw) and starts its keys' residuals afresh.
//
// One Compressor per KVWorker or KVServer: its state is by key (and, on a
// server, by worker and customer). Delta pulls assume a key's answer does
// not depend on the pull's command (cmd) beyond time: the view is by key.
//
// Thread-safety: Encode and Decode may run on several threads at once.
#ifndef PS_COMPRESS_H_
#define PS_COMPRESS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ps/filter.h"
#include "ps/range.h"
#include "ps/status.h"

namespace ps {

// One way to put floats on the wire.
struct Codec {
  enum Kind : uint8_t {
    kNone = 0,
    kFp16 = 1,
    kBf16 = 2,
    kTopK = 3,
    kRandomK = 4,
    kOneBit = 5,
  };
  Kind kind = kNone;
  double ratio = 0;  // topk, randomk: the fraction of values sent, (0, 1]

  // "none", "fp16", "bf16", "topk:R", "randomk:R", "onebit"; an error names
  // the text and what is accepted.
  static StatusOr<Codec> Parse(const std::string& text);
  std::string ToString() const;
  // Whether a worker keeps what this codec did not send (error feedback).
  bool feedback() const {
    return kind == kTopK || kind == kRandomK || kind == kOneBit;
  }
};

// Values of this many floats share one onebit scale.
constexpr size_t kOneBitChunk = 1024;

struct CompressOptions {
  Codec push;  // gradients, worker to server
  Codec pull;  // weights, server to worker (onebit, topk, randomk: deltas)
  // Keys in a range use its codec for pushes instead of `push` (the first
  // range that holds the key).
  struct RangeCodec {
    Range keys;
    Codec push;
  };
  std::vector<RangeCodec> push_ranges;
  // Compress also to peers that take the values by reference (shared
  // memory): tests, and measuring the codecs' cost on one host.
  bool compress_shared = false;
  uint64_t seed = 1;  // of randomk's draws
  // Decode refuses a message that would decode to more floats (a sparse
  // codec's few bytes may stand for many: this bounds what a peer can make
  // a node allocate).
  uint64_t max_values = uint64_t{1} << 26;

  // "PUSH" or "PUSH,pull=PULL" (e.g. "topk:0.01,pull=bf16", "none,pull=bf16").
  static StatusOr<CompressOptions> Parse(const std::string& text);
  // From PS_COMPRESS (Parse's text; unset or empty: none); the error names
  // the variable and its value.
  static StatusOr<CompressOptions> FromEnv();
  // Whether any codec is set (else adding the filter changes nothing).
  bool any() const;
  std::string ToString() const;
};

class Compressor : public Filter {
 public:
  // An error names a codec whose ratio is out of range.
  static StatusOr<std::shared_ptr<Compressor>> Make(CompressOptions options);
  ~Compressor() override;

  std::string name() const override { return "compress"; }
  StatusOr<bool> Encode(const FilterContext& ctx, KVFrames* frames,
                        std::string* note) override;
  Status Decode(const FilterContext& ctx, const std::string& note,
                KVFrames* frames) override;

  const CompressOptions& options() const { return options_; }
  // The push codec of `key`.
  const Codec& PushCodecOf(uint64_t key) const;

  // Error feedback: the values kept per key, as bytes for a checkpoint,
  // and back ("" is no values kept; a corrupt state is refused, leaving the
  // current one). A push of another count of values for a key starts its
  // residual afresh.
  std::string SaveState() const;
  Status RestoreState(const std::string& state);
  // What error feedback holds of `key` (empty if nothing).
  std::vector<float> Residual(uint64_t key) const;
  // Delta pulls, on a server: the keys answered as deltas, and whole.
  struct PullCounts {
    uint64_t delta_keys = 0, whole_keys = 0;
  };
  PullCounts pull_counts() const;

 private:
  struct Feedback;  // the residuals, views and randomk's generator, locked
  struct View;      // a worker's copy of a key's weights, and its version
  explicit Compressor(CompressOptions options);

  const CompressOptions options_;
  const std::unique_ptr<Feedback> feedback_;
};

}  // namespace ps

#endif  // PS_COMPRESS_H_
