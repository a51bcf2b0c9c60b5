// DenseShard: the server side of dense training (dense_server.h), composed
// of its parts in src/kv: DenseAggregator (per-step sums and the gate of
// bsp/bounded/async), DenseSlice (the weights and the optimizer step),
// Replicator (its slot in a replica chain) and CheckpointSchedule (when its
// state belongs to a checkpoint set). What is left here is the protocol:
// decoding a request, answering or holding it, and what a dead worker means.
//
// Replication under kBsp (PS_REPLICAS=1) forwards once per step: the
// primary's shard tells its server that it replicates kStep pushes itself
// (KVServer::set_replica_steps), so they are not copied one by one; when a
// (step, range) is complete it sends the sum to the replica (Replicate:
// ReplicateStep, the pushes summed into it named as its covers), applies
// it, and answers those pushes, whose answers the server holds until the
// replica answered the sum. The replica's shard answers the sum and
// applies it as the primary does (OnPrimarySum): the same floats, the same
// updater, so the same weights and optimizer state, bit for bit. Both
// optimizer steps run at once, and the wait for the replica is the sum's
// trip there and the answer's back. Other consistencies, kDone, and every
// push of a job whose shards go on without a lost worker (kContinue) go
// push by push (the server copies them).
#include "ps/dense_server.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kv/aggregator.h"
#include "kv/checkpointer.h"
#include "kv/dense_slice.h"
#include "kv/replicator.h"
#include "van/sync.h"

namespace ps {

StatusOr<Consistency> ParseConsistency(const std::string& name) {
  if (name == "bsp") return Consistency::kBsp;
  if (name == "bounded") return Consistency::kBounded;
  if (name == "async") return Consistency::kAsync;
  return Status::InvalidArgument("unknown consistency '" + name +
                                 "' (expected bsp, bounded or async)");
}

const char* ConsistencyName(Consistency c) {
  switch (c) {
    case Consistency::kBsp:
      return "bsp";
    case Consistency::kBounded:
      return "bounded";
    case Consistency::kAsync:
      return "async";
  }
  return "unknown";
}

StatusOr<WorkerFailure> ParseWorkerFailure(const std::string& name) {
  if (name == "stop") return WorkerFailure::kStop;
  if (name == "continue") return WorkerFailure::kContinue;
  if (name == "restart") return WorkerFailure::kRestart;
  return Status::InvalidArgument("unknown worker failure policy '" + name +
                                 "' (expected stop, continue or restart)");
}

namespace {
constexpr int kStepBits = 20;
constexpr int kTagBits = 8;
constexpr int kOpShift = kStepBits + kTagBits;
constexpr int kNumOps = 3;
}  // namespace

int EncodeDenseCmd(DenseOp op, int step, int tag) {
  CHECK(step >= 0 && step <= kMaxDenseStep) << "step " << step;
  CHECK(tag >= 0 && tag <= kMaxDenseTag) << "tag " << tag;
  return (static_cast<int>(op) << kOpShift) | (tag << kStepBits) | step;
}

StatusOr<DenseCmd> DecodeDenseCmd(int cmd) {
  int op = cmd >> kOpShift;
  if (cmd < 0 || op >= kNumOps) {
    return Status::InvalidArgument("cmd " + std::to_string(cmd) +
                                   " is no dense-shard command");
  }
  DenseCmd c;
  c.op = static_cast<DenseOp>(op);
  c.step = cmd & kMaxDenseStep;
  c.tag = (cmd >> kStepBits) & kMaxDenseTag;
  return c;
}

class DenseShard::Impl : public KVRequestHandler<float> {
 public:
  Impl(KVServer<float>* server, const DenseLayout& layout, Key first_key,
       Key end_key, const std::vector<float>& weights,
       const DenseShardOptions& options, DenseUpdater updater,
       DenseSnapshot snapshot);
  ~Impl() override;

  bool WaitAllDone(std::chrono::milliseconds timeout) EXCLUDES(done_mu_);
  Status failure() const EXCLUDES(done_mu_);
  // Only while no request is in flight (dense_server.h): the analysis
  // cannot see that, so it is not asked to.
  const SArray<float>& weights() const NO_THREAD_SAFETY_ANALYSIS {
    return slice_.weights();
  }
  int64_t updates_applied() const { return applied_.load(); }
  int max_staleness() const { return max_staleness_.load(); }
  int64_t bad_requests() const { return bad_requests_.load(); }
  int64_t weight_copies() const { return weight_copies_.load(); }
  int workers_lost() const { return workers_lost_.load(); }
  int workers_rejoined() const { return workers_rejoined_.load(); }
  void SnapshotAt(int step) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    schedule_.At(step);
  }

 private:
  struct PendingPull {
    KVMeta meta;
    SArray<Key> keys;
    int step = 0;
  };

  void Handle(const KVMeta& meta, const KVPairs<float>& data) override
      EXCLUDES(mu_);
  // False when the push was rejected (and answered).
  bool OnPush(const KVMeta& meta, const DenseCmd& cmd,
              const KVPairs<float>& data) REQUIRES(mu_);
  void OnDone(int worker, int steps) REQUIRES(mu_);
  // One more worker done (WaitAllDone's count).
  void CountDone() EXCLUDES(done_mu_);
  // Applies every complete (step, range) in order, then answers the pulls
  // it allows.
  void Advance() REQUIRES(mu_);
  // The optimizer step on [begin, end), whose update the aggregator has
  // counted; then the snapshot, if due.
  void Apply(Key begin, Key end, const float* grad_sum, int num_grads, int step,
             int tag) REQUIRES(mu_);
  void AnswerPull(const KVMeta& meta, const SArray<Key>& keys, int step)
      REQUIRES(mu_);
  // Replication by step (see the top): the primary sends the sum it applied
  // to [begin, end) for `step` and answers the pushes summed into it; the
  // replica applies it.
  void Replicate(Key begin, Key end, const float* grad_sum, int num_grads,
                 int step, int tag) REQUIRES(mu_);
  void OnPrimarySum(const KVMeta& meta, const DenseCmd& cmd,
                    const KVPairs<float>& data) REQUIRES(mu_);
  void Reject(const KVMeta& meta, const std::string& why);
  // A peer died: a worker still expected fails the shard, or is taken as
  // done (see Failures).
  void OnFailure(int id, const Status& why) override EXCLUDES(mu_, done_mu_);
  // Stops serving steps with `why` (once): pending and later step requests
  // are refused with it, and WaitAllDone returns. The number refused now.
  size_t StopServing(const Status& why) REQUIRES(mu_) EXCLUDES(done_mu_);
  // Forgets the pending pulls of dead worker `id` (nobody to answer).
  void DropPullsOf(int id) REQUIRES(mu_) {
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [id](const PendingPull& p) {
                                    return p.meta.sender == id;
                                  }),
                   pending_.end());
  }
  // kContinue: `id` counts as done at the step in flight.
  void GoOnWithout(int id, const Status& why) EXCLUDES(mu_);
  // kJoin: a restarted worker asks where to resume; answers each key with
  // the step (see kJoin in dense_server.h).
  void OnJoin(const KVMeta& meta, const KVPairs<float>& data) REQUIRES(mu_);
  // Calls snapshot_ when every key has had the same number of updates
  // applied and the schedule says it is due (see Snapshots).
  void MaybeSnapshot() REQUIRES(mu_);

  KVServer<float>* const server_;
  const DenseShardOptions options_;
  const DenseSnapshot snapshot_;

  // The receive thread's (requests), and the failure handle's.
  Mutex mu_;
  DenseAggregator aggregator_ GUARDED_BY(mu_);
  // Its weights are shared with pull answers in flight; weights() reads
  // them without mu_ (only while no request is in flight, as documented).
  DenseSlice slice_ GUARDED_BY(mu_);
  CheckpointSchedule schedule_ GUARDED_BY(mu_);
  std::vector<PendingPull> pending_ GUARDED_BY(mu_);
  // Replication by step: whether this shard forwards its steps' sums, and
  // the pushes summed into each (step, first key) not yet forwarded; they
  // are answered when it is (Replicate).
  bool by_step_ = false;
  std::map<std::pair<int, Key>, std::vector<KVMeta>> covers_ GUARDED_BY(mu_);
  Status failed_ GUARDED_BY(mu_);  // a dead worker: steps are refused
  // kRestart: workers declared dead and awaited back (until their kJoin).
  std::set<int> away_ GUARDED_BY(mu_);
  // A replica: the rank whose keys it holds (KVMeta::shard of the requests
  // it gets; -1 before the first). It snapshots only once that server is
  // down (the node's routes say so).
  int held_rank_ GUARDED_BY(mu_) = -1;

  std::atomic<int64_t> applied_{0};
  std::atomic<int> max_staleness_{0};
  std::atomic<int64_t> bad_requests_{0};
  std::atomic<int64_t> weight_copies_{0};
  std::atomic<int> workers_lost_{0};
  std::atomic<int> workers_rejoined_{0};
  mutable Mutex done_mu_;
  CondVar done_cv_{&done_mu_};
  int num_done_ GUARDED_BY(done_mu_) = 0;
  Status failure_ GUARDED_BY(done_mu_);

  // Registers the handles last and is detached first (~Impl): no request
  // runs while the members above are made or destroyed.
  Replicator<float> replicator_;
};

namespace {

DenseAggregator::Options AggregatorOptions(const DenseShardOptions& o) {
  DenseAggregator::Options a;
  a.consistency = o.consistency;
  a.max_delay = o.max_delay;
  a.num_workers = o.num_workers;
  a.first_step = o.first_step;
  a.allow_non_finite = o.allow_non_finite;
  a.repeats_applied = o.replica && o.consistency == Consistency::kBsp;
  return a;
}

}  // namespace

DenseShard::Impl::Impl(KVServer<float>* server, const DenseLayout& layout,
                       Key first_key, Key end_key,
                       const std::vector<float>& weights,
                       const DenseShardOptions& options, DenseUpdater updater,
                       DenseSnapshot snapshot)
    : server_(server),
      options_(options),
      snapshot_(std::move(snapshot)),
      aggregator_(AggregatorOptions(options), first_key, end_key),
      slice_(layout, first_key, end_key, weights, std::move(updater)),
      schedule_(options.snapshot_every, options.first_step),
      applied_(options.first_step),
      replicator_(server, options.replica) {
  CHECK(options_.first_step >= 0 && options_.first_step <= kMaxDenseStep)
      << "first_step " << options_.first_step;
  CHECK_GE(options_.snapshot_every, 0);
  // Under kContinue a worker lost after a failover counts as done from the
  // step it last pushed, which only a replica that saw each push can tell:
  // those jobs keep forwarding push by push.
  if (!options_.replica && options_.consistency == Consistency::kBsp &&
      options_.on_worker_failure != WorkerFailure::kContinue) {
    by_step_ = server->set_replica_steps([](const KVMeta& meta) {
      StatusOr<DenseCmd> cmd = DecodeDenseCmd(meta.cmd);
      return cmd.ok() && cmd->op == DenseOp::kStep;
    });
  }
  // Under BSP the keys of all shards are at most one update apart: a
  // restarted worker resumes at the least step (kJoin) and pulls it, where
  // some keys may hold that step's update already (see AnswerPull).
  if (options_.consistency == Consistency::kBsp &&
      options_.on_worker_failure == WorkerFailure::kRestart) {
    slice_.KeepPrevious();
  }
  replicator_.Attach(this);
}

DenseShard::Impl::~Impl() { replicator_.Detach(); }

bool DenseShard::Impl::WaitAllDone(std::chrono::milliseconds timeout) {
  MutexLock lock(&done_mu_);
  auto deadline = CondVar::Clock::now() + timeout;
  while (num_done_ < options_.num_workers && failure_.ok() &&
         done_cv_.WaitUntil(deadline)) {
  }
  return num_done_ >= options_.num_workers;
}

Status DenseShard::Impl::failure() const {
  MutexLock lock(&done_mu_);
  return failure_;
}

void DenseShard::Impl::OnFailure(int id, const Status& why) {
  if (!IsWorkerId(id)) return;  // a server, the scheduler, or our own stop
  if (options_.on_worker_failure == WorkerFailure::kContinue) {
    return GoOnWithout(id, why);
  }
  if (options_.on_worker_failure == WorkerFailure::kRestart &&
      why.code() == Status::kUnavailable) {
    // Awaited back (its successor may die too: still awaited). Dead for
    // good (PeerFailed: it did not rejoin in time): as kStop, below.
    MutexLock lock(&mu_);
    if (aggregator_.IsDone(id)) return;
    away_.insert(id);
    aggregator_.Restarted(id);
    DropPullsOf(id);
    LOG(WARNING) << "dense shard: waiting for " << DescribeId(id)
                 << " to rejoin: " << why;
    return;
  }
  MutexLock lock(&mu_);
  if (aggregator_.IsDone(id) || !failed_.ok()) return;
  StopServing(Status::PeerFailed("the dense shard stopped serving steps: " +
                                 why.message()));
}

size_t DenseShard::Impl::StopServing(const Status& why) {
  if (!failed_.ok()) return 0;
  failed_ = why;
  for (const PendingPull& p : pending_) server_->ResponseError(p.meta, why);
  for (const auto& [range, pushes] : covers_) {
    for (const KVMeta& push : pushes) {
      if (!push.pull) server_->ResponseError(push, why);
    }
  }
  covers_.clear();
  const size_t refused = pending_.size();
  pending_.clear();
  {
    MutexLock done_lock(&done_mu_);
    failure_ = why;
  }
  done_cv_.SignalAll();
  LOG(ERROR) << "dense shard: " << why << " (" << refused
             << " pending pulls refused)";
  return refused;
}

void DenseShard::Impl::GoOnWithout(int id, const Status& why) {
  int step;
  {
    MutexLock lock(&mu_);
    step = aggregator_.Lose(id);  // done at `step` from now on
    if (step < 0) return;
    // Its pulls could not be answered anyway.
    DropPullsOf(id);
    ++workers_lost_;
    CountDone();
    Advance();
  }
  LOG(WARNING) << "dense shard: going on without " << DescribeId(id)
               << " from its step " << step << " on: " << why;
}

void DenseShard::Impl::Handle(const KVMeta& meta, const KVPairs<float>& data) {
  MutexLock lock(&mu_);
  if (options_.replica && meta.shard >= 0) held_rank_ = meta.shard;
  if (aggregator_.IsLost(meta.sender)) {
    LOG(WARNING) << "dense shard: dropped a request of the dead "
                 << DescribeId(meta.sender);
    return;
  }
  StatusOr<DenseCmd> cmd = DecodeDenseCmd(meta.cmd);
  if (!cmd.ok()) return Reject(meta, cmd.status().message());
  if (cmd->op == DenseOp::kDone) {
    if (!meta.push) return Reject(meta, "a done command must be a push");
    server_->Response(meta);
    OnDone(meta.sender, cmd->step);
    return;
  }
  if (cmd->op == DenseOp::kJoin) return OnJoin(meta, data);
  if (!failed_.ok()) return server_->ResponseError(meta, failed_);
  if (options_.replica && IsServerId(meta.sender)) {
    return OnPrimarySum(meta, *cmd, data);
  }
  if (meta.push && options_.on_push) options_.on_push(cmd->step, meta.sender);
  if (meta.push && !OnPush(meta, *cmd, data)) return;  // rejected: answered
  if (!meta.pull) return;
  if (aggregator_.PullReady(data.keys, cmd->step)) {
    AnswerPull(meta, data.keys, cmd->step);
  } else {
    pending_.push_back({meta, data.keys, cmd->step});
  }
}

bool DenseShard::Impl::OnPush(const KVMeta& meta, const DenseCmd& cmd,
                              const KVPairs<float>& data) {
  Key begin = 0, end = 0;
  std::string why;
  DenseAggregator::Verdict verdict = DenseAggregator::Verdict::kRefused;
  if (slice_.PushRange(data.keys, data.vals.size(), &begin, &end, &why)) {
    verdict = aggregator_.Push(meta.sender, cmd.step, cmd.tag, begin, end,
                               data.vals, meta.vals_borrowed, &why);
  }
  switch (verdict) {
    case DenseAggregator::Verdict::kRefused:
      // A gradient refused is a step that cannot be summed exactly: the
      // workers waiting on it would wait forever for a live member that
      // will not send it again. So the shard stops, naming the member.
      Reject(meta, why);
      StopServing(Status::PeerFailed(
          "the dense shard stopped serving steps: it refused the gradient "
          "of step " +
          std::to_string(cmd.step) + " of " + DescribeId(meta.sender) + ": " +
          why));
      return false;
    case DenseAggregator::Verdict::kApplyNow:
      aggregator_.CountApplied(begin, end);
      Apply(begin, end, data.vals.data(), options_.num_workers, cmd.step,
            cmd.tag);
      break;
    case DenseAggregator::Verdict::kSummed:
      if (by_step_) {
        // Answered once its sum is on the replica (Replicate).
        covers_[{cmd.step, begin}].push_back(meta);
        Advance();
        return true;
      }
      Advance();
      break;
    case DenseAggregator::Verdict::kRepeated:
      break;
  }
  if (!meta.pull) server_->Response(meta);
  return true;
}

void DenseShard::Impl::OnJoin(const KVMeta& meta, const KVPairs<float>& data) {
  if (!meta.pull || meta.push)
    return Reject(meta, "a join command must be a pull");
  const int worker = meta.sender;
  const int resume = aggregator_.ResumeStep(worker);
  for (Key k : data.keys) {
    size_t offset, length;
    if (!slice_.Locate(k, &offset, &length)) {
      return Reject(
          meta, "key " + std::to_string(k) + " is not in " + slice_.Describe());
    }
  }
  KVPairs<float> res;
  res.keys = data.keys;
  res.lens.resize(data.keys.size(), 1);
  res.vals.resize(data.keys.size(), static_cast<float>(resume));
  if (away_.erase(worker) > 0) ++workers_rejoined_;
  LOG(WARNING) << "dense shard: " << DescribeId(worker)
               << " rejoined; it resumes at step " << resume;
  server_->Response(meta, res);
}

void DenseShard::Impl::OnDone(int worker, int steps) {
  if (!aggregator_.Done(worker, steps)) {
    LOG(WARNING) << "dense shard: " << DescribeId(worker)
                 << " sent done twice; ignored";
    return;
  }
  CountDone();
  Advance();
}

void DenseShard::Impl::CountDone() {
  {
    MutexLock lock(&done_mu_);
    ++num_done_;
  }
  done_cv_.SignalAll();
}

void DenseShard::Impl::Advance() {
  aggregator_.ApplyReady([this](const DenseAggregator::Ready& r) {
    mu_.AssertHeld();  // ApplyReady runs it, under mu_
    Apply(r.begin, r.end, r.sum, r.num_grads, r.step, r.tag);
  });
  std::vector<PendingPull> still;
  std::vector<PendingPull> ready;
  for (PendingPull& p : pending_) {
    (aggregator_.PullReady(p.keys, p.step) ? ready : still)
        .push_back(std::move(p));
  }
  pending_ = std::move(still);
  for (const PendingPull& p : ready) AnswerPull(p.meta, p.keys, p.step);
}

void DenseShard::Impl::Apply(Key begin, Key end, const float* grad_sum,
                             int num_grads, int step, int tag) {
  // The sum goes first: the replica applies it while this shard does.
  if (by_step_) Replicate(begin, end, grad_sum, num_grads, step, tag);
  if (slice_.Apply(begin, end, grad_sum, num_grads, step, tag)) {
    ++weight_copies_;
  }
  applied_.store(aggregator_.LeastApplied());
  MaybeSnapshot();
}

void DenseShard::Impl::MaybeSnapshot() {
  int steps;
  // A replica writes once it stands in for the server whose keys it holds.
  const bool standing_in =
      !options_.replica || replicator_.ServerDown(held_rank_);
  if (!snapshot_ || options_.consistency != Consistency::kBsp ||
      workers_lost_.load() > 0 || !aggregator_.Uniform(&steps) ||
      !schedule_.Due(steps) || !standing_in) {
    return;
  }
  const SArray<float>& w = slice_.weights();
  snapshot_(steps, w.data(), w.size());
}

void DenseShard::Impl::AnswerPull(const KVMeta& meta, const SArray<Key>& keys,
                                  int step) {
  KVPairs<float> res;
  std::string why;
  // A restarted worker's pull may be for a step some keys have applied
  // already (see kRestart): KeepPrevious answers it.
  const bool answered =
      slice_.keeps_previous()
          ? slice_.AnswerStep(
                keys, step,
                [this](Key k) {
                  mu_.AssertHeld();  // called inside AnswerStep, under mu_
                  return aggregator_.Applied(k);
                },
                &res, &why)
          : slice_.Answer(keys, &res, &why);
  if (!answered) return Reject(meta, why);
  if (options_.consistency != Consistency::kAsync) {
    const int missing = aggregator_.Missing(keys, step);
    if (missing > max_staleness_.load()) max_staleness_.store(missing);
  }
  server_->Response(meta, res);
}

void DenseShard::Impl::Replicate(Key begin, Key end, const float* grad_sum,
                                 int num_grads, int step, int tag) {
  std::vector<KVMeta> covers;
  auto it = covers_.find({step, begin});
  if (it != covers_.end()) {
    covers = std::move(it->second);
    covers_.erase(it);
  }
  // The sum's own bytes: ZeroMQ may send them after the next step reused
  // the frame it was summed in.
  const size_t n = slice_.Floats(begin, end);
  KVPairs<float> sum;
  sum.keys = SArray<Key>({begin, end});
  sum.lens = SArray<int>({static_cast<int>(n), 0});
  sum.vals.CopyFrom(grad_sum, n);
  server_->ReplicateStep(EncodeDenseCmd(DenseOp::kStep, step, tag), num_grads,
                         sum, covers);
  for (const KVMeta& push : covers) {
    if (!push.pull) server_->Response(push);
  }
}

void DenseShard::Impl::OnPrimarySum(const KVMeta& meta, const DenseCmd& cmd,
                                    const KVPairs<float>& data) {
  Key begin = 0, end = 0;
  std::string why;
  if (!meta.push || cmd.op != DenseOp::kStep ||
      !slice_.SumRange(data.keys, data.vals.size(), &begin, &end, &why)) {
    return Reject(meta, why.empty() ? "a primary sends kStep sums only" : why);
  }
  switch (aggregator_.Adopt(cmd.step, begin, end, &why)) {
    case DenseAggregator::Verdict::kApplyNow:
      // Answered before it is applied: nothing this shard does comes
      // between (mu_), and a shard that dies first takes the answer's
      // worth with it (its primary then goes on alone).
      server_->Response(meta);
      Apply(begin, end, data.vals.data(), meta.priority, cmd.step, cmd.tag);
      Advance();
      return;
    case DenseAggregator::Verdict::kRepeated:
      return server_->Response(meta);
    default:
      return Reject(meta, why);
  }
}

void DenseShard::Impl::Reject(const KVMeta& meta, const std::string& why) {
  ++bad_requests_;
  LOG(WARNING) << "dense shard: refused a request of "
               << DescribeId(meta.sender) << ": " << why;
  server_->ResponseError(meta, Status::InvalidArgument(why));
}

DenseShard::DenseShard(KVServer<float>* server, const DenseLayout& layout,
                       Key first_key, Key end_key,
                       const std::vector<float>& weights,
                       const DenseShardOptions& options, DenseUpdater updater,
                       DenseSnapshot snapshot)
    : impl_(std::make_unique<Impl>(server, layout, first_key, end_key, weights,
                                   options, std::move(updater),
                                   std::move(snapshot))) {}
DenseShard::~DenseShard() = default;
bool DenseShard::WaitAllDone(std::chrono::milliseconds timeout) {
  return impl_->WaitAllDone(timeout);
}
Status DenseShard::failure() const { return impl_->failure(); }
const SArray<float>& DenseShard::weights() const { return impl_->weights(); }
int64_t DenseShard::updates_applied() const { return impl_->updates_applied(); }
int DenseShard::max_staleness() const { return impl_->max_staleness(); }
int64_t DenseShard::bad_requests() const { return impl_->bad_requests(); }
int64_t DenseShard::weight_copies() const { return impl_->weight_copies(); }
int DenseShard::workers_lost() const { return impl_->workers_lost(); }
int DenseShard::workers_rejoined() const { return impl_->workers_rejoined(); }
void DenseShard::SnapshotAt(int step) { impl_->SnapshotAt(step); }

}  // namespace ps
