// The state of a Compressor (ps/compress.h), behind one lock: a worker's
// push residuals (error feedback) and its views of the weights it pulls as
// deltas; a server's views of each worker's weights, the versions the pull
// requests in flight claim, and its counts of delta and whole answers.
// compress_state.cc holds the state's changes per key and its checkpoint
// form; compressor.cc the filter that reads and writes the frames and the
// note around them.
//
// Thread-safety: every member is guarded by `mu`; the Compressor takes it
// around each Encode, Decode and state call.
#ifndef PS_KV_COMPRESS_STATE_H_
#define PS_KV_COMPRESS_STATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/codecs.h"
#include "ps/compress.h"
#include "van/sync.h"

namespace ps {

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

// One key of a message being encoded: its codec, and whether it goes as a
// delta from the worker's view (a delta-pull answer).
struct KeyCodec {
  Codec codec;
  bool delta = false;
};

// A pull request's claims: by key, the version of its view the worker holds.
using Claims = std::unordered_map<uint64_t, uint64_t>;
// A delta-pull answer's versions, per key: (base, new), the version a delta
// starts from (0: whole values) and the one it makes.
using ViewVersions = std::vector<std::pair<uint64_t, uint64_t>>;

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
  std::map<Id3, Claims> claims GUARDED_BY(mu);
  // Versions start at random: a restarted process never reuses one.
  uint64_t next_version GUARDED_BY(mu) =
      std::random_device()() | uint64_t{std::random_device()()} << 32;
  PullCounts pulls GUARDED_BY(mu);
  std::string versions_out GUARDED_BY(mu);  // PutAnswer's, for EncodeValues

  // What one Encode's keys reuse (a local of PutSegments).
  struct Scratch {
    SegmentScratch segment;
    std::vector<float> delta, sent;
  };

  // Encode's values part (compressor.cc): the codecs, error feedback and
  // views, in its steps.
  Status EncodeValues(const Compressor& compressor, const FilterContext& ctx,
                      KVFrames* frames, std::string* note) REQUIRES(mu);
  // Each key's codec; false if none compresses (nor answers as deltas).
  bool PlanKeys(const Compressor& compressor, const FilterContext& ctx,
                const KVFrames& frames, const std::vector<uint64_t>& counts,
                const float* vals, const Claims* claimed,
                std::vector<KeyCodec>* plan, size_t* bytes) REQUIRES(mu);
  // Writes each key's segment in [p, end) (which PlanKeys sized); a
  // delta-pull answer's versions go to versions_out.
  void PutSegments(const FilterContext& ctx, const KVFrames& frames,
                   const std::vector<uint64_t>& counts,
                   const std::vector<KeyCodec>& plan, bool answer_deltas,
                   const float* vals, char* p, const char* end) REQUIRES(mu);
  // Decode's values (compressor.cc): each key's segment into o, a delta
  // checked against its view first.
  Status DecodeKeys(const KVFrames& frames, const std::vector<uint8_t>& kinds,
                    const std::vector<uint64_t>& counts,
                    const ViewVersions& versions, float* o) REQUIRES(mu);

  // The per-key changes (compress_state.cc). A server: takes away the
  // claims of the request (peer, customer, timestamp), false if it made
  // none; keeps those of a new pull request (at most kMaxClaims requests).
  bool TakeClaims(const Id3& request, Claims* claimed) REQUIRES(mu);
  void StoreClaims(const Id3& request, Claims claimed) REQUIRES(mu);
  // A server: key's segment of an answer to worker (peer, customer), a
  // delta from its view or whole values, and the view moved to match.
  void PutAnswer(const Id3& view_id, const KeyCodec& kc, const float* v,
                 size_t len, Scratch* scratch, char** p) REQUIRES(mu);
  // A worker: key's segment of a push, through its residual.
  void PutPush(uint64_t key, const Codec& c, const float* v, size_t len,
               Scratch* scratch, char** p) REQUIRES(mu);
  // A worker: whether a delta of len values from `versions` (null: the
  // answer named none) can apply to its view of key; an error names both
  // versions and `where`.
  Status CheckDelta(uint64_t key, const std::pair<uint64_t, uint64_t>* versions,
                    size_t len, const std::string& where) REQUIRES(mu);
  // A worker: one key of a decoded answer, its len values at o, applied to
  // its view: a delta adds to the view, and o gets the view's values; whole
  // values replace it. The view is then at `version`.
  void ApplyAnswer(uint64_t key, bool delta, size_t len, uint64_t version,
                   float* o) REQUIRES(mu);

  // Requests that are never answered (refused, their worker gone) cannot
  // grow the table: past this many the oldest go (answered whole).
  static constexpr size_t kMaxClaims = 4096;
};

// In a note's run of keys: the kind's bit that marks a delta pull.
constexpr uint8_t kDelta = 0x80;

}  // namespace ps

#endif  // PS_KV_COMPRESS_STATE_H_
