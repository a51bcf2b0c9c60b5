// DenseShard: the server side of data-parallel training of a dense model.
// A server owns one contiguous float slice of the model's flat parameter
// vector, addressed by keys that name fixed-size chunks of it; workers push
// gradients per step and pull weights, and the shard sums the gradients of a
// step, applies a user updater (e.g. an optimizer) to its slice and serves
// weights under a consistency model:
//
//   kBsp      the update of step t is applied once every active worker's
//             step-t gradient arrived; a pull for step t+1 is answered only
//             after that update (bounded delay with tau = 0).
//   kBounded  stale-synchronous with delay tau: gradients are still summed
//             per step and applied in step order, but a pull for step s is
//             answered as soon as the update of step s-1-tau is applied, so
//             the weights a worker computes step s on miss at most tau
//             updates (the shard records the largest number it served).
//   kAsync    every push is applied as it comes (num_grads = num_workers,
//             so an averaging updater scales it by 1/W); pulls are answered
//             at once.
//
// Ranges: a step's gradient may come in several pushes, each a contiguous,
// ascending run of the shard's keys (a range), so that a worker can send the
// gradients that are final early in its backward pass before the rest. Every
// worker must push the same ranges each step (in any order); together they
// must cover the shard. All of the above holds per range and per key: a
// range of step t is applied once every active worker pushed it and each of
// its keys has had step t-1 applied; a pull for step s is answered once
// every key it names has update s-1-tau applied. A push whose range
// overlaps a different range already pending for the same step is rejected
// (a bad request).
//
// The request's cmd (KVMeta::cmd) carries an op, a step and a user tag, see
// EncodeDenseCmd:  bits 0..19 step, bits 20..27 tag, bits 28..30 op.
//   kStep push: the gradient of `step` for a range of keys (above; one push
//               per worker, step and range); answered once summed (and
//               applied, when it was the last the range waited for).
//   kStep pull: weights to compute `step` on (any keys of the shard);
//               answered when the consistency model allows (above).
//   kDone push: the worker pushed `step` steps in all and sends no more; the
//               shard stops waiting for it from that step on. Any keys of
//               the shard (one is enough).
// The tag is passed to the updater with the step (e.g. the epoch, for a
// learning-rate schedule). Workers must send to every server their steps in
// order (the van keeps one sender's messages in order).
//
// Copies: the first push of a (step, range) is adopted as its sum (the others
// are added into it, in the received frame; borrowed values, see
// KVMeta::vals_borrowed, are copied unless they are applied at once), and
// pull answers are segments of the weights, not copies (a co-located worker
// that pulls into shared memory gets them written there by the KV layer). An
// update that finds the weights still shared with an answer ZeroMQ has not
// finished sending writes to a fresh copy (copy on write; under BSP it is rare:
// no worker pushes the next step before it has received its answer, so the
// frames have long left).
//
// Refusals: a request the shard cannot serve (a bad cmd, a range outside
// the shard, a late or overlapping gradient) is answered with
// KVServer::ResponseError (InvalidArgument with the reason): the worker's
// Wait returns it.
//
// Failures: when a worker that has not sent kDone is declared dead, the
// shard stops waiting for it: pending pulls and every later kStep request
// are refused with PeerFailed naming the dead worker, and WaitAllDone
// returns false (failure() says why). kDone is still answered.
//
// Thread-safety: requests run on the KVServer's receive thread, one at a
// time, under the shard's mutex (which only the failure handle also takes);
// the updater runs there. The accessors below may be called from any
// thread; weights() only while no request is in flight (e.g. after
// WaitAllDone). The destructor unregisters the shard from its server (it
// waits for a running request) so the server may outlive it.
#ifndef PS_DENSE_SERVER_H_
#define PS_DENSE_SERVER_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ps/base.h"
#include "ps/kv_app.h"
#include "ps/status.h"

namespace ps {

enum class Consistency { kBsp, kBounded, kAsync };

// "bsp", "bounded" or "async"; InvalidArgument naming the value otherwise.
StatusOr<Consistency> ParseConsistency(const std::string& name);
const char* ConsistencyName(Consistency c);

enum class DenseOp { kStep = 0, kDone = 1 };

constexpr int kMaxDenseStep = (1 << 20) - 1;
constexpr int kMaxDenseTag = (1 << 8) - 1;

struct DenseCmd {
  DenseOp op = DenseOp::kStep;
  int step = 0;  // [0, kMaxDenseStep]
  int tag = 0;   // [0, kMaxDenseTag]
};

// CHECKs the ranges (a step beyond kMaxDenseStep is a caller bug).
int EncodeDenseCmd(DenseOp op, int step, int tag = 0);
// InvalidArgument for a cmd no worker of this layer sends.
StatusOr<DenseCmd> DecodeDenseCmd(int cmd);

// The keys of a dense vector of `total` floats cut in chunks of `chunk`
// floats: key k holds floats [k * chunk, min((k + 1) * chunk, total)).
struct DenseLayout {
  size_t total = 0;
  size_t chunk = 0;
  size_t num_keys() const {
    return chunk == 0 ? 0 : (total + chunk - 1) / chunk;
  }
  size_t offset(Key k) const { return static_cast<size_t>(k) * chunk; }
  size_t length(Key k) const {
    size_t o = offset(k);
    return o >= total ? 0 : std::min(chunk, total - o);
  }
};

struct DenseShardOptions {
  Consistency consistency = Consistency::kBsp;
  int max_delay = 0;    // tau, for kBounded (kBsp is tau = 0)
  int num_workers = 1;  // workers that push every step until done
};

// Called once per update of a range with the range's n weights and the
// summed gradient of `num_grads` pushes (the caller averages if it wants).
// offset: where the range starts within this shard's slice (w points there),
// so that per-range state such as an optimizer's can be kept by (offset, n).
// step: the step the update belongs to (kAsync: the pusher's step); tag: its
// cmd tag.
using DenseUpdater =
    std::function<void(float* w, const float* grad_sum, size_t offset, size_t n,
                       int num_grads, int step, int tag)>;

class DenseShard {
 public:
  // Owns `weights`, the floats of keys [first_key, end_key) of `layout`
  // (weights.size() must equal their total length). Registers itself as the
  // request handle of `server`, which must outlive this shard.
  DenseShard(KVServer<float>* server, const DenseLayout& layout, Key first_key,
             Key end_key, std::vector<float> weights,
             const DenseShardOptions& options, DenseUpdater updater);
  ~DenseShard();
  DenseShard(const DenseShard&) = delete;
  DenseShard& operator=(const DenseShard&) = delete;

  // Blocks until every worker sent kDone, a worker died (see Failures) or
  // `timeout` passes; true if all sent kDone.
  bool WaitAllDone(std::chrono::milliseconds timeout);
  // OK, or why the shard stopped serving steps (a dead worker).
  Status failure() const;

  const SArray<float>& weights() const { return weights_; }
  // Updates every key of the shard has had applied (the least per key).
  int64_t updates_applied() const { return applied_.load(); }
  // The most updates missing from weights served to a pull (see kBounded);
  // never above tau under kBsp/kBounded. 0 under kAsync (not tracked).
  int max_staleness() const { return max_staleness_.load(); }
  int64_t bad_requests() const { return bad_requests_.load(); }
  // Updates that had to copy the weights first (see Copies above).
  int64_t weight_copies() const { return weight_copies_.load(); }

 private:
  struct RangeSum {     // the pushes of one (step, range)
    Key end = 0;        // the range is [first key of the map entry, end)
    SArray<float> sum;  // the first pushed frame, summed into
    int count = 0;
    int tag = 0;
  };
  struct PendingPull {
    KVMeta meta;
    SArray<Key> keys;
    int step = 0;
  };

  void Handle(const KVMeta& meta, const KVPairs<float>& data,
              KVServer<float>* server);
  // False when the push was rejected (and answered).
  bool OnPush(const KVMeta& meta, const DenseCmd& cmd,
              const KVPairs<float>& data);
  // The range [*begin, *end) a push carries, or why it is no range.
  bool PushRange(const KVPairs<float>& data, Key* begin, Key* end,
                 std::string* why) const;
  // Why [begin, end) may not be summed for `step` (empty when it may).
  std::string CheckPending(int step, Key begin, Key end) const;
  void OnDone(int worker, int steps);
  // Applies every complete (step, range) in order, then answers the pulls
  // it allows.
  void Advance();
  // Runs the updater on [begin, end) and counts the update for its keys.
  void Apply(Key begin, Key end, const float* grad_sum, int num_grads, int step,
             int tag);
  int ExpectedAt(int step) const;
  // Whether `count` pushes of [begin, end) for `step` are all it waits for
  // and every key of it has step - 1 applied (Advance would apply it).
  bool AppliesAt(int step, Key begin, Key end, int count) const;
  bool PullReady(const SArray<Key>& keys, int step) const;
  // Offset of key k (or of end_key_, the slice's size) within weights_.
  size_t SliceOffset(Key k) const;
  void AnswerPull(const KVMeta& meta, const SArray<Key>& keys, int step);
  // Offset of key k within weights_, or false when k is not ours.
  bool Locate(Key k, size_t* offset, size_t* length) const;
  void Reject(const KVMeta& meta, const std::string& why);
  // A peer died: a worker still expected fails the shard (see Failures).
  void OnFailure(int id, const Status& why);
  // weights_, made exclusively ours first (copy on write).
  float* MutableWeights();

  KVServer<float>* const server_;
  const DenseLayout layout_;
  const Key first_key_, end_key_;
  const DenseShardOptions options_;
  const DenseUpdater updater_;
  SArray<float> weights_;  // shared with pull answers in flight

  // Guarded by mu_ (the receive thread's, and the failure handle's): ranges
  // in flight by (step, first key), updates applied per key (index k -
  // first_key_), pulls waiting, who is done, why steps are refused.
  std::mutex mu_;
  std::map<std::pair<int, Key>, RangeSum> sums_;
  std::vector<int> key_applied_;
  std::vector<PendingPull> pending_;
  std::map<int, int> done_steps_;  // worker id -> steps it pushed in all
  Status failed_;                  // a dead worker: steps are refused

  std::atomic<int64_t> applied_{0};
  std::atomic<int> max_staleness_{0};
  std::atomic<int64_t> bad_requests_{0};
  std::atomic<int64_t> weight_copies_{0};
  mutable std::mutex done_mu_;  // guards num_done_, failure_
  std::condition_variable done_cv_;
  int num_done_ = 0;
  Status failure_;
};

}  // namespace ps

#endif  // PS_DENSE_SERVER_H_
