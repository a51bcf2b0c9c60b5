// DenseAggregator: the consistency layer of a dense shard, without sockets
// or weights. It owns the per-(step, range) gradient sums, the number of
// updates each key has had applied, and what it knows of each worker (the
// last step it pushed, its done step, whether it died or was restarted); it
// decides whether a push is refused (CheckPending, CheckAhead, CheckFinite),
// summed or a repeat, which sums are complete and in what order they are
// applied, whether a pull of a step may be answered (the gate of kBsp,
// kBounded and kAsync, dense_server.h), and where a restarted worker
// resumes. Applying a sum to the weights is the caller's (DenseSlice).
//
// Inputs are calls (a push, a done, a lost or restarted worker); outputs
// are the verdicts and the ranges ApplyReady hands out, so it is tested by
// feeding it calls (tests/core/aggregator_test.cc).
//
// Thread-safety: none of its own. Its owner (DenseShard::Impl) keeps it
// GUARDED_BY the shard's mutex and calls it under that mutex only.
#ifndef PS_SRC_KV_AGGREGATOR_H_
#define PS_SRC_KV_AGGREGATOR_H_

#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ps/base.h"
#include "ps/dense_server.h"
#include "ps/sarray.h"

namespace ps {

class DenseAggregator {
 public:
  struct Options {
    Consistency consistency = Consistency::kBsp;
    int max_delay = 0;  // tau (kBsp: 0)
    int num_workers = 1;
    int first_step = 0;  // every key starts with this many updates applied
    bool allow_non_finite = false;
    // A replica fed the primary's sums (Adopt): a push of a step applied
    // already is a worker's resend of one summed into such a sum, answered
    // without being summed (kRepeated), not a late one.
    bool repeats_applied = false;
  };

  // A complete (step, range), handed out by ApplyReady: its keys have had
  // the update counted already; `sum` holds `num_grads` summed gradients.
  struct Ready {
    int step = 0;
    Key begin = 0, end = 0;
    const float* sum = nullptr;
    int num_grads = 0;
    int tag = 0;
  };

  // What Push did with a gradient.
  enum class Verdict {
    kSummed,    // added to its (step, range); ApplyReady may apply it now
    kApplyNow,  // kAsync: the caller applies it at once (CountApplied)
    kRepeated,  // made before (PushedBefore): answered, not summed again
    kRefused,   // *why says why; nothing changed but the worker's record
  };

  // The shard holds keys [first_key, end_key).
  DenseAggregator(const Options& options, Key first_key, Key end_key);

  // Worker `worker`'s gradient of `step` for keys [begin, end) (a range of
  // the shard, checked by the caller), `vals` its floats. A kSummed first
  // push of a range is adopted as the range's sum (no copy: the caller
  // hands over a frame that is its alone), unless `borrowed` (the worker's
  // shared memory) and the range is not applied at once: then it is copied.
  Verdict Push(int worker, int step, int tag, Key begin, Key end,
               const SArray<float>& vals, bool borrowed, std::string* why);

  // Applies every complete (step, range), in (step, first key) order:
  // counts the update for its keys, then calls apply(ready). apply may read
  // updates_applied(); it must not call back into this object otherwise.
  void ApplyReady(const std::function<void(const Ready&)>& apply);
  // Counts one update of [begin, end) applied outside the sums (kAsync).
  void CountApplied(Key begin, Key end);
  // The primary's complete sum of `step` for [begin, end) (a replica's,
  // kBsp): kApplyNow when every key has had exactly the steps before it
  // applied (counted now: the caller applies the sum); kRepeated when they
  // are past it (the sum came again); else kRefused and *why.
  Verdict Adopt(int step, Key begin, Key end, std::string* why);

  // Whether a pull of `step` for `keys` may be answered now (kAsync:
  // always). Keys outside the shard are the caller's to refuse.
  bool PullReady(const SArray<Key>& keys, int step) const;
  // The most updates missing from the weights of `keys` served to a pull of
  // `step` (0 when none; keys must be in the shard).
  int Missing(const SArray<Key>& keys, int step) const;

  // `worker` pushed `steps` steps in all and sends no more. False (nothing
  // changes) when it said so before.
  bool Done(int worker, int steps);
  bool IsDone(int worker) const { return done_steps_.count(worker) > 0; }
  // kContinue: `worker`, dead before its done, counts as done at the last
  // step it pushed any range of (first_step when none); its pushes of that
  // step count, but its range waits for the live workers only. -1 when it
  // was done or lost already; else the step.
  int Lose(int worker);
  bool IsLost(int worker) const { return dead_.count(worker) > 0; }
  // kRestart: `worker` was declared dead and may come back; its successor's
  // pushes may repeat its own (PushedBefore).
  void Restarted(int worker) { restarted_.insert(worker); }
  // kJoin: the step a restarted `worker` resumes at (dense_server.h).
  int ResumeStep(int worker) const;

  // Updates applied to key k; -1 for a key not of the shard.
  int Applied(Key k) const {
    return k < first_key_ || k >= end_key_ ? -1 : AppliedOf(k);
  }
  // Per-key updates applied (index: key - first key).
  const std::vector<int>& key_applied() const { return key_applied_; }
  // The least per key (first_step for a shard without keys).
  int LeastApplied() const;
  // Whether every key has had exactly the same number of updates applied;
  // that number in *steps.
  bool Uniform(int* steps) const;
  size_t pending_sums() const { return sums_.size(); }

  // Why [begin, end) may not be summed for `step` (empty when it may): a
  // key applied past it, or another range of the step that overlaps it.
  std::string CheckPending(int step, Key begin, Key end) const;
  // Why a push of `step` is further ahead than the consistency model lets a
  // worker be (empty when not).
  std::string CheckAhead(int step, Key begin, Key end) const;
  // Why `vals` may not be summed: a NaN or an infinity, unless
  // allow_non_finite (empty when they may).
  std::string CheckFinite(int step, Key begin, Key end,
                          const SArray<float>& vals) const;

 private:
  struct RangeSum {     // the pushes of one (step, range)
    Key end = 0;        // the range is [first key of the map entry, end)
    SArray<float> sum;  // the first pushed frame, summed into
    int count = 0;
    std::vector<int> from;  // the pushing workers' ids
    int tag = 0;
  };

  // Whether a push of `step` for [begin, end) was made before: summed
  // already, or (a restarted worker's) applied already.
  bool PushedBefore(int worker, int step, Key begin, Key end) const;
  // Workers still expected to push `step`.
  int ExpectedAt(int step) const;
  // Whether `count` pushes of [begin, end) for `step` are all it waits for
  // and every key of it has step - 1 applied.
  bool AppliesAt(int step, Key begin, Key end, int count) const;
  // The pushes of `s` by workers still expected at `step`: a worker lost
  // (kContinue) at that step may have pushed before it died; its gradient
  // is summed, but the range still waits for every live worker's.
  int Counted(const RangeSum& s, int step) const;
  int& AppliedOf(Key k) { return key_applied_[k - first_key_]; }
  int AppliedOf(Key k) const { return key_applied_[k - first_key_]; }

  const Options options_;
  const Key first_key_, end_key_;
  // Ranges in flight by (step, first key).
  std::map<std::pair<int, Key>, RangeSum> sums_;
  std::vector<int> key_applied_;
  // Worker id -> steps it pushed in all (its done).
  std::map<int, int> done_steps_;
  // Worker id -> the last step it pushed (any range).
  std::map<int, int> last_push_;
  std::set<int> dead_;  // lost under kContinue
  // Workers that ever died under kRestart (their successor's pushes may
  // repeat their predecessor's; a replica never sees the kJoin, which is a
  // pull).
  std::set<int> restarted_;
};

}  // namespace ps

#endif  // PS_SRC_KV_AGGREGATOR_H_
