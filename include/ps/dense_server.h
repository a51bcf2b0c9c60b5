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
//   kJoin pull: a restarted worker (kRestart) asks where to resume: each key
//               named (any of the shard) is answered with one value, the
//               step (exact in a float: steps are below 2^20) to pull and
//               push next. kBsp/kBounded: the least step any key of the
//               shard still waits for; kAsync: after its last push; the
//               step of its kDone if it sent one. A worker resumes at the
//               least answer of all shards.
// The tag is passed to the updater with the step (e.g. the epoch, for a
// learning-rate schedule). Workers must send to every server their steps in
// order (the van keeps one sender's messages in order).
//
// Copies: the first push of a (step, range) is adopted as its sum (the others
// are added into it, in the received frame, which is the shard's alone: the
// KV layer reads no request frame after the handle got it; borrowed values,
// see KVMeta::vals_borrowed, are copied unless they are applied at once), and
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
// shard stops waiting for it, as DenseShardOptions::on_worker_failure says:
//   kStop      pending pulls and every later kStep request are refused with
//              PeerFailed naming the dead worker, and WaitAllDone returns
//              false (failure() says why). kDone is still answered.
//   kContinue  the dead worker counts as done at the last step it pushed
//              any range of (the step in flight; the step it would have
//              pushed next when it pushed nothing of it yet): a range of
//              that step is applied once the live workers pushed it, with
//              whatever gradients arrived, the dead one's included if its
//              push came first (the updater's num_grads says how many);
//              later steps wait for the live workers only. Its pending
//              pulls and any later request of it are dropped. WaitAllDone
//              returns true once every live worker sent kDone.
//   kRestart   (PS_MAX_RESTARTS, launch.py --max-restarts) the dead worker
//              is awaited back (its failure comes as Unavailable): the
//              shard keeps waiting for its gradients (its pending pulls
//              are dropped). Its successor asks where to
//              resume (kJoin), pulls and pushes from there; the pushes its
//              predecessor made already (summed or applied) are answered
//              and not summed again, so every update still has all
//              workers' gradients. The step in flight: every shard
//              answers kJoin, the worker resumes at the least answer, and
//              under kBsp a pull for that step gets that step's weights on
//              every shard, also for the ranges where the old process's
//              push had arrived and been applied already (the shard keeps
//              each range's weights from before its last update, a copy
//              per update, and refuses a pull for an older step). So under
//              BSP, with no dropout, a worker that died anywhere in a step,
//              between its pushes to two servers too, resumes bit-exactly.
//              Under kBounded a range may be several updates ahead: the
//              successor computes the rest of the step on weights that hold
//              them (approximate). Under kAsync, which applies pushes as
//              they come, it resumes after the last step it pushed to the
//              shard that answers the least: a step it had pushed to some
//              shards but not others is pushed to those again
//              (approximate, as async is). Declared dead for
//              good (PeerFailed: it did not rejoin within
//              PS_REJOIN_TIMEOUT_MS): as kStop.
//
// Snapshots (kBsp): each time every key of the shard has had exactly t
// updates applied, t a multiple of snapshot_every or a step named by
// SnapshotAt before it was reached, the shard calls the
// snapshot callback with t and its weights (a consistent state: no key has
// any of step t applied yet), before it answers a pull for step t; none
// after a worker was lost. A replica shard snapshots only once the server
// whose keys it holds is down (it took them over): then it writes what that
// server wrote, so checkpoint sets stay whole after a failover. A restored
// shard (first_step = t) starts with every key at t updates: its first
// pulls are for step t.
//
// Thread-safety: requests run on the KVServer's receive thread, one at a
// time, under the shard's mutex (which only the failure handle also takes);
// the updater and the snapshot callback run there (under that mutex: they
// must not call back into the shard). The accessors below may be called from
// any thread; weights() only while no request is in flight (e.g. after
// WaitAllDone). The destructor unregisters the shard from its server (it
// waits for a running request) so the server may outlive it.
#ifndef PS_DENSE_SERVER_H_
#define PS_DENSE_SERVER_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
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

enum class DenseOp { kStep = 0, kDone = 1, kJoin = 2 };

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

// What the shard does when a worker dies before kDone (see Failures).
enum class WorkerFailure { kStop, kContinue, kRestart };

// "stop", "continue" or "restart"; InvalidArgument naming the value
// otherwise.
StatusOr<WorkerFailure> ParseWorkerFailure(const std::string& name);

struct DenseShardOptions {
  Consistency consistency = Consistency::kBsp;
  int max_delay = 0;    // tau, for kBounded (kBsp is tau = 0)
  int num_workers = 1;  // workers that push every step until done
  WorkerFailure on_worker_failure = WorkerFailure::kStop;
  // A restored shard: `weights` already hold this many updates of every
  // key, and workers resume at this step.
  int first_step = 0;
  // kBsp: call the snapshot callback every this many steps (0: only at
  // SnapshotAt's steps).
  int snapshot_every = 0;
  // Replication (PS_REPLICAS=1): this shard holds the keys of the server
  // this one is the replica of (PrimaryOf its rank), registered with
  // KVServer::set_replica_handle: under kBsp the sums that server's shard
  // applies come here, once a step and range (the primary's shard sends
  // them: KVServer::set_replica_steps), otherwise the pushes it gets; and
  // when it dies, its workers' requests. Make it before the server's own
  // shard. It snapshots only after that server died.
  bool replica = false;
  // A pushed gradient with a NaN or an infinity is refused (its Wait fails
  // naming the step, keys and value) unless this is set.
  bool allow_non_finite = false;
  // Called as a kStep push from a worker arrives, before the shard sums it
  // (its step and the worker's id), on the receive thread under the
  // shard's mutex (it must not call back into the shard). A point of the
  // step where nothing of it went to the replica yet: fault tests freeze a
  // primary there; tracing may count arrivals.
  std::function<void(int step, int sender)> on_push = nullptr;
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

// Called with the number of steps applied to every key (a multiple of
// snapshot_every) and the shard's n weights (see Snapshots above).
using DenseSnapshot =
    std::function<void(int steps, const float* weights, size_t n)>;

class DenseShard {
 public:
  // Owns `weights`, the floats of keys [first_key, end_key) of `layout`
  // (weights.size() must equal their total length). Registers itself as the
  // request handle of `server`, which must outlive this shard.
  DenseShard(KVServer<float>* server, const DenseLayout& layout, Key first_key,
             Key end_key, const std::vector<float>& weights,
             const DenseShardOptions& options, DenseUpdater updater,
             DenseSnapshot snapshot = nullptr);
  ~DenseShard();
  DenseShard(const DenseShard&) = delete;
  DenseShard& operator=(const DenseShard&) = delete;

  // Also snapshot at `step` (see Snapshots), e.g. a step a worker picked
  // by the clock; it must come before that step's update can be applied.
  // Any thread.
  void SnapshotAt(int step);

  // Blocks until every worker sent kDone, a worker died (see Failures) or
  // `timeout` passes; true if all sent kDone.
  bool WaitAllDone(std::chrono::milliseconds timeout);
  // OK, or why the shard stopped serving steps (a dead worker).
  Status failure() const;

  const SArray<float>& weights() const;
  // Updates every key of the shard has had applied (the least per key).
  int64_t updates_applied() const;
  // The most updates missing from weights served to a pull (see kBounded);
  // never above tau under kBsp/kBounded. 0 under kAsync (not tracked).
  int max_staleness() const;
  int64_t bad_requests() const;
  // Updates that had to copy the weights first (see Copies above).
  int64_t weight_copies() const;
  // Workers declared dead before kDone that the shard went on without
  // (kContinue).
  int workers_lost() const;
  // Workers that rejoined after they were declared dead (kRestart).
  int workers_rejoined() const;

 private:
  // src/kv/dense_server.cc: the protocol and its locks, composed of the
  // parts in src/kv (aggregator.h, dense_slice.h, replicator.h,
  // checkpointer.h).
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps

#endif  // PS_DENSE_SERVER_H_
