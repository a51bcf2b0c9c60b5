// DenseShard: per-step gradient sums, ordered updates and pull gating for
// BSP, bounded delay and async training of a dense model (dense_server.h).
#include "ps/dense_server.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>

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

class DenseShard::Impl {
 public:
  Impl(KVServer<float>* server, const DenseLayout& layout, Key first_key,
       Key end_key, std::vector<float> weights,
       const DenseShardOptions& options, DenseUpdater updater,
       DenseSnapshot snapshot);
  ~Impl();

  bool WaitAllDone(std::chrono::milliseconds timeout) EXCLUDES(done_mu_);
  Status failure() const EXCLUDES(done_mu_);
  // Only while no request is in flight (dense_server.h): the analysis
  // cannot see that, so it is not asked to.
  const SArray<float>& weights() const NO_THREAD_SAFETY_ANALYSIS {
    return weights_;
  }
  int64_t updates_applied() const { return applied_.load(); }
  int max_staleness() const { return max_staleness_.load(); }
  int64_t bad_requests() const { return bad_requests_.load(); }
  int64_t weight_copies() const { return weight_copies_.load(); }
  int workers_lost() const { return workers_lost_.load(); }
  int workers_rejoined() const { return workers_rejoined_.load(); }
  void SnapshotAt(int step) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    snapshot_at_.insert(step);
  }

 private:
  struct RangeSum {     // the pushes of one (step, range)
    Key end = 0;        // the range is [first key of the map entry, end)
    SArray<float> sum;  // the first pushed frame, summed into
    int count = 0;
    std::vector<int> from;  // the pushing workers' ids
    int tag = 0;
  };
  struct PendingPull {
    KVMeta meta;
    SArray<Key> keys;
    int step = 0;
  };

  void Handle(const KVMeta& meta, const KVPairs<float>& data,
              KVServer<float>* server) EXCLUDES(mu_);
  // False when the push was rejected (and answered).
  bool OnPush(const KVMeta& meta, const DenseCmd& cmd,
              const KVPairs<float>& data) REQUIRES(mu_);
  // The range [*begin, *end) a push carries, or why it is no range.
  bool PushRange(const KVPairs<float>& data, Key* begin, Key* end,
                 std::string* why) const REQUIRES(mu_);
  // Why [begin, end) may not be summed for `step` (empty when it may).
  std::string CheckPending(int step, Key begin, Key end) const REQUIRES(mu_);
  // Why a push of `step` is further ahead than the consistency model lets a
  // worker be, or holds a NaN or infinity (empty when neither).
  std::string CheckAhead(int step, Key begin, Key end) const REQUIRES(mu_);
  std::string CheckFinite(int step, Key begin, Key end,
                          const SArray<float>& vals) const REQUIRES(mu_);
  void OnDone(int worker, int steps) REQUIRES(mu_);
  // Applies every complete (step, range) in order, then answers the pulls
  // it allows.
  void Advance() REQUIRES(mu_);
  // Runs the updater on [begin, end) and counts the update for its keys.
  void Apply(Key begin, Key end, const float* grad_sum, int num_grads, int step,
             int tag) REQUIRES(mu_);
  int ExpectedAt(int step) const REQUIRES(mu_);
  // Whether `count` pushes of [begin, end) for `step` are all it waits for
  // and every key of it has step - 1 applied (Advance would apply it).
  bool AppliesAt(int step, Key begin, Key end, int count) const REQUIRES(mu_);
  // The pushes of `s` by workers still expected at `step`: a worker lost
  // (kContinue) at that step may have pushed before it died; its gradient
  // is summed, but the range still waits for every live worker's.
  int Counted(const RangeSum& s, int step) const REQUIRES(mu_);
  bool PullReady(const SArray<Key>& keys, int step) const REQUIRES(mu_);
  // Offset of key k (or of end_key_, the slice's size) within weights_.
  size_t SliceOffset(Key k) const REQUIRES(mu_);
  void AnswerPull(const KVMeta& meta, const SArray<Key>& keys, int step)
      REQUIRES(mu_);
  // Offset of key k within weights_, or false when k is not ours.
  bool Locate(Key k, size_t* offset, size_t* length) const;
  void Reject(const KVMeta& meta, const std::string& why);
  // A peer died: a worker still expected fails the shard, or is taken as
  // done (see Failures).
  void OnFailure(int id, const Status& why) EXCLUDES(mu_, done_mu_);
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
  // Whether a push of `step` for [begin, end) was made before: summed
  // already, or (a restarted worker's) applied already. Answered, not
  // summed again.
  bool PushedBefore(int worker, int step, Key begin, Key end) const
      REQUIRES(mu_);
  // Calls snapshot_ when every key has had the same multiple of
  // snapshot_every updates applied (see Snapshots).
  void MaybeSnapshot() REQUIRES(mu_);
  // weights_, made exclusively ours first (copy on write).
  float* MutableWeights() REQUIRES(mu_);

  KVServer<float>* const server_;
  const DenseLayout layout_;
  const Key first_key_, end_key_;
  const DenseShardOptions options_;
  const DenseUpdater updater_;
  const DenseSnapshot snapshot_;
  // Shared with pull answers in flight. Written under mu_; weights() reads
  // it without (only while no request is in flight, as documented).
  SArray<float> weights_ GUARDED_BY(mu_);

  // Guarded by mu_ (the receive thread's, and the failure handle's): ranges
  // in flight by (step, first key), updates applied per key (index k -
  // first_key_), pulls waiting, who is done, why steps are refused.
  Mutex mu_;
  std::map<std::pair<int, Key>, RangeSum> sums_ GUARDED_BY(mu_);
  std::vector<int> key_applied_ GUARDED_BY(mu_);
  std::vector<PendingPull> pending_ GUARDED_BY(mu_);
  // Worker id -> steps it pushed in all.
  std::map<int, int> done_steps_ GUARDED_BY(mu_);
  Status failed_ GUARDED_BY(mu_);  // a dead worker: steps are refused
  // Worker id -> the last step it pushed (any range); dead workers (kContinue).
  std::map<int, int> last_push_ GUARDED_BY(mu_);
  std::set<int> dead_ GUARDED_BY(mu_);
  // kRestart: workers declared dead and awaited back (until their kJoin);
  // workers that ever died (their successor's pushes may repeat their
  // predecessor's; a replica never sees the kJoin, which is a pull).
  std::set<int> away_ GUARDED_BY(mu_);
  std::set<int> restarted_ GUARDED_BY(mu_);
  int last_snapshot_ GUARDED_BY(mu_);
  std::set<int> snapshot_at_ GUARDED_BY(mu_);  // SnapshotAt's steps

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
};

DenseShard::Impl::Impl(KVServer<float>* server, const DenseLayout& layout,
                       Key first_key, Key end_key, std::vector<float> weights,
                       const DenseShardOptions& options, DenseUpdater updater,
                       DenseSnapshot snapshot)
    : server_(server),
      layout_(layout),
      first_key_(first_key),
      end_key_(end_key),
      options_(options),
      updater_(std::move(updater)),
      snapshot_(std::move(snapshot)),
      weights_(weights),
      key_applied_(end_key - first_key, options.first_step),
      last_snapshot_(options.first_step),
      applied_(options.first_step) {
  CHECK_LE(first_key_, end_key_);
  CHECK_GE(options_.num_workers, 1);
  CHECK_GE(options_.max_delay, 0);
  CHECK(options_.first_step >= 0 && options_.first_step <= kMaxDenseStep)
      << "first_step " << options_.first_step;
  CHECK_GE(options_.snapshot_every, 0);
  size_t expect = 0;
  for (Key k = first_key_; k < end_key_; ++k) expect += layout_.length(k);
  CHECK_EQ(expect, weights_.size())
      << "keys [" << first_key_ << ", " << end_key_ << ") hold " << expect
      << " floats";
  auto on_failure = [this](int id, const Status& why) { OnFailure(id, why); };
  auto handle = [this](const KVMeta& meta, const KVPairs<float>& data,
                       KVServer<float>* s) { Handle(meta, data, s); };
  if (options_.replica) {
    server_->set_replica_failure_handle(on_failure);
    server_->set_replica_handle(handle);
  } else {
    server_->set_failure_handle(on_failure);
    server_->set_request_handle(handle);
  }
}

DenseShard::Impl::~Impl() {
  if (options_.replica) {
    server_->clear_replica_handle();
  } else {
    server_->clear_request_handle();
  }
}

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
    if (done_steps_.count(id) > 0) return;
    away_.insert(id);
    restarted_.insert(id);
    DropPullsOf(id);
    LOG(WARNING) << "dense shard: waiting for " << DescribeId(id)
                 << " to rejoin: " << why;
    return;
  }
  const Status failed = Status::PeerFailed(
      "the dense shard stopped serving steps: " + why.message());
  size_t refused;
  {
    MutexLock lock(&mu_);
    if (done_steps_.count(id) > 0 || !failed_.ok()) return;
    failed_ = failed;
    for (const PendingPull& p : pending_) {
      server_->ResponseError(p.meta, failed);
    }
    refused = pending_.size();
    pending_.clear();
    {
      MutexLock done_lock(&done_mu_);
      failure_ = failed;
    }
  }
  done_cv_.SignalAll();
  LOG(ERROR) << "dense shard: " << failed << " (" << refused
             << " pending pulls refused)";
}

void DenseShard::Impl::GoOnWithout(int id, const Status& why) {
  int step;
  {
    MutexLock lock(&mu_);
    if (done_steps_.count(id) > 0 || !dead_.insert(id).second) return;
    auto it = last_push_.find(id);
    step = it == last_push_.end() ? options_.first_step : it->second;
    // Its pulls could not be answered anyway.
    DropPullsOf(id);
    ++workers_lost_;
    OnDone(id, step);
  }
  LOG(WARNING) << "dense shard: going on without " << DescribeId(id)
               << " from its step " << step << " on: " << why;
}

void DenseShard::Impl::Handle(const KVMeta& meta, const KVPairs<float>& data,
                              KVServer<float>* /*server*/) {
  MutexLock lock(&mu_);
  if (dead_.count(meta.sender) > 0) {
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
  if (meta.push && !OnPush(meta, *cmd, data)) return;  // rejected: answered
  if (!meta.pull) return;
  if (options_.consistency == Consistency::kAsync ||
      PullReady(data.keys, cmd->step)) {
    AnswerPull(meta, data.keys, cmd->step);
  } else {
    pending_.push_back({meta, data.keys, cmd->step});
  }
}

bool DenseShard::Impl::PushRange(const KVPairs<float>& data, Key* begin,
                                 Key* end, std::string* why) const {
  const std::string shard =
      "[" + std::to_string(first_key_) + ", " + std::to_string(end_key_) + ")";
  if (data.keys.empty()) {
    *why = "a gradient push carries no keys";
    return false;
  }
  *begin = data.keys[0];
  *end = *begin + data.keys.size();
  if (*begin < first_key_ || *end > end_key_ || *end < *begin) {
    *why = "a gradient push leaves the shard " + shard;
    return false;
  }
  for (size_t i = 0; i < data.keys.size(); ++i) {
    if (data.keys[i] != *begin + i) {
      *why = "a gradient push must carry a contiguous range of keys of " +
             shard + " in order";
      return false;
    }
  }
  if (data.vals.size() != SliceOffset(*end) - SliceOffset(*begin)) {
    *why = "a gradient push of keys [" + std::to_string(*begin) + ", " +
           std::to_string(*end) + ") carries " +
           std::to_string(data.vals.size()) + " floats";
    return false;
  }
  return true;
}

std::string DenseShard::Impl::CheckPending(int step, Key begin, Key end) const {
  for (Key k = begin; k < end; ++k) {
    if (key_applied_[k - first_key_] > step) {
      return "gradient of step " + std::to_string(step) + " for key " +
             std::to_string(k) + " arrived after that step was applied";
    }
  }
  for (auto it = sums_.lower_bound({step, 0});
       it != sums_.end() && it->first.first == step; ++it) {
    const Key b = it->first.second, e = it->second.end;
    if ((b != begin || e != end) && b < end && begin < e) {
      return "keys [" + std::to_string(begin) + ", " + std::to_string(end) +
             ") of step " + std::to_string(step) + " overlap the range [" +
             std::to_string(b) + ", " + std::to_string(e) +
             ") other workers pushed";
    }
  }
  return "";
}

// Under kBsp and kBounded a worker pushes step s only after it pulled the
// weights of step s - 1 - max_delay, so a push further ahead than that (and
// one step of slack) is refused: the sums buffered per range stay bounded
// by max_delay + 2 steps whatever a member sends.
std::string DenseShard::Impl::CheckAhead(int step, Key begin, Key end) const {
  int least = key_applied_[begin - first_key_];
  for (Key k = begin; k < end; ++k) {
    least = std::min(least, key_applied_[k - first_key_]);
  }
  const int limit = least + options_.max_delay + 1;
  if (step <= limit) return "";
  return "gradient of step " + std::to_string(step) + " for keys [" +
         std::to_string(begin) + ", " + std::to_string(end) +
         ") is ahead of what the consistency model allows (step " +
         std::to_string(least) + " is being summed, max_delay " +
         std::to_string(options_.max_delay) + ")";
}

// A NaN or an infinity in one gradient ruins every weight it is summed
// into, so it is refused unless DenseShardOptions::allow_non_finite.
std::string DenseShard::Impl::CheckFinite(int step, Key begin, Key end,
                                          const SArray<float>& vals) const {
  if (options_.allow_non_finite) return "";
  const float* v = vals.data();
  for (size_t i = 0; i < vals.size(); ++i) {
    if (!std::isfinite(v[i])) {
      return "gradient of step " + std::to_string(step) + " for keys [" +
             std::to_string(begin) + ", " + std::to_string(end) +
             ") holds a non-finite value (" + std::to_string(v[i]) +
             ") at float " + std::to_string(i) +
             " (DenseShardOptions::allow_non_finite accepts them)";
    }
  }
  return "";
}

bool DenseShard::Impl::OnPush(const KVMeta& meta, const DenseCmd& cmd,
                              const KVPairs<float>& data) {
  Key begin = 0, end = 0;
  std::string why;
  if (!PushRange(data, &begin, &end, &why)) {
    Reject(meta, why);
    return false;
  }
  int& last = last_push_[meta.sender];
  if (options_.consistency == Consistency::kAsync) {
    last = std::max(last, cmd.step);
    Apply(begin, end, data.vals.data(), options_.num_workers, cmd.step,
          cmd.tag);
    if (!meta.pull) server_->Response(meta);
    return true;
  }
  if (PushedBefore(meta.sender, cmd.step, begin, end)) {
    if (!meta.pull) server_->Response(meta);
    return true;
  }
  why = CheckPending(cmd.step, begin, end);
  if (why.empty()) why = CheckAhead(cmd.step, begin, end);
  if (why.empty()) why = CheckFinite(cmd.step, begin, end, data.vals);
  if (!why.empty()) {
    Reject(meta, why);
    return false;
  }
  last = std::max(last, cmd.step);
  RangeSum& s = sums_[{cmd.step, begin}];
  if (s.count == 0) {
    s.end = end;
    s.tag = cmd.tag;
    // A received frame is adopted as the sum (no copy): it is ours alone,
    // nothing else reads it once we write into it (KVMeta::vals_borrowed;
    // the replica's copy has its own bytes). So are borrowed values (the
    // worker's shared memory) that Advance applies right below, only read,
    // before the answer lets the worker write them again; other borrowed
    // values are copied.
    if (meta.vals_borrowed && !AppliesAt(cmd.step, begin, end, 1)) {
      s.sum.CopyFrom(data.vals);
    } else {
      s.sum = data.vals;
    }
  } else {
    const float* g = data.vals.data();
    for (size_t i = 0; i < s.sum.size(); ++i) s.sum[i] += g[i];
  }
  ++s.count;
  s.from.push_back(meta.sender);
  Advance();
  if (!meta.pull) server_->Response(meta);
  return true;
}

void DenseShard::Impl::OnJoin(const KVMeta& meta, const KVPairs<float>& data) {
  if (!meta.pull || meta.push)
    return Reject(meta, "a join command must be a pull");
  const int worker = meta.sender;
  // Under kBsp/kBounded each key has had every step before the least one
  // applied, and a worker pushes no step before it pulled the weights of
  // the one before: it resumes at the least step any key waits for, and
  // what its predecessor pushed of later steps is not summed twice
  // (PushedBefore). kAsync applies pushes as they come: after the last.
  int resume = options_.first_step;
  auto done = done_steps_.find(worker);
  auto last = last_push_.find(worker);
  if (done != done_steps_.end()) {
    resume = done->second;
  } else if (options_.consistency == Consistency::kAsync) {
    if (last != last_push_.end()) resume = last->second + 1;
  } else if (!key_applied_.empty()) {
    resume = *std::min_element(key_applied_.begin(), key_applied_.end());
  }
  for (Key k : data.keys) {
    if (k < first_key_ || k >= end_key_) {
      return Reject(meta, "key " + std::to_string(k) + " is not in [" +
                              std::to_string(first_key_) + ", " +
                              std::to_string(end_key_) + ")");
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

bool DenseShard::Impl::PushedBefore(int worker, int step, Key begin,
                                    Key end) const {
  // Summed already (from any worker: a push comes once, the KV layer
  // drops a resent one; twice only from a successor).
  auto s = sums_.find({step, begin});
  if (s != sums_.end()) {
    return std::find(s->second.from.begin(), s->second.from.end(), worker) !=
           s->second.from.end();
  }
  // Applied already: the range waited for every worker, this one included
  // (for a successor's push; any other's is a late one, refused below).
  if (restarted_.count(worker) == 0) return false;
  for (Key k = begin; k < end; ++k) {
    if (key_applied_[k - first_key_] <= step) return false;
  }
  return begin < end;
}

void DenseShard::Impl::OnDone(int worker, int steps) {
  if (!done_steps_.emplace(worker, steps).second) {
    LOG(WARNING) << "dense shard: " << DescribeId(worker)
                 << " sent done twice; ignored";
    return;
  }
  {
    MutexLock lock(&done_mu_);
    ++num_done_;
  }
  done_cv_.SignalAll();
  Advance();
}

bool DenseShard::Impl::AppliesAt(int step, Key begin, Key end,
                                 int count) const {
  const int expected = ExpectedAt(step);
  if (expected <= 0 || count < expected) return false;
  for (Key k = begin; k < end; ++k) {
    if (key_applied_[k - first_key_] != step) return false;
  }
  return true;
}

int DenseShard::Impl::Counted(const RangeSum& s, int step) const {
  if (dead_.empty()) return s.count;
  int n = 0;
  for (int id : s.from) {
    auto done = done_steps_.find(id);
    n += done == done_steps_.end() || done->second > step;
  }
  return n;
}

int DenseShard::Impl::ExpectedAt(int step) const {
  int n = options_.num_workers;
  for (const auto& [worker, steps] : done_steps_) n -= steps <= step;
  return n;
}

bool DenseShard::Impl::PullReady(const SArray<Key>& keys, int step) const {
  for (Key k : keys) {
    if (k < first_key_ || k >= end_key_) continue;  // AnswerPull rejects it
    const int applied = key_applied_[k - first_key_];
    // Nothing can be applied any more once every worker is past its last
    // step.
    if (ExpectedAt(applied) <= 0) continue;
    if (step - applied > options_.max_delay) return false;
  }
  return true;
}

void DenseShard::Impl::Advance() {
  // (step, first key) order: applying a range of step t can only enable
  // entries of later steps, which come later in this one pass.
  for (auto it = sums_.begin(); it != sums_.end();) {
    const int step = it->first.first;
    const Key begin = it->first.second;
    const RangeSum& s = it->second;
    if (!AppliesAt(step, begin, s.end, Counted(s, step))) {
      ++it;
      continue;
    }
    Apply(begin, s.end, s.sum.data(), s.count, step, s.tag);
    it = sums_.erase(it);
  }
  std::vector<PendingPull> still;
  std::vector<PendingPull> ready;
  for (PendingPull& p : pending_) {
    (PullReady(p.keys, p.step) ? ready : still).push_back(std::move(p));
  }
  pending_ = std::move(still);
  for (const PendingPull& p : ready) AnswerPull(p.meta, p.keys, p.step);
}

void DenseShard::Impl::Apply(Key begin, Key end, const float* grad_sum,
                             int num_grads, int step, int tag) {
  const size_t offset = SliceOffset(begin);
  updater_(MutableWeights() + offset, grad_sum, offset,
           SliceOffset(end) - offset, num_grads, step, tag);
  for (Key k = begin; k < end; ++k) ++key_applied_[k - first_key_];
  if (!key_applied_.empty()) {
    applied_.store(*std::min_element(key_applied_.begin(), key_applied_.end()));
  }
  MaybeSnapshot();
}

void DenseShard::Impl::MaybeSnapshot() {
  const int every = options_.snapshot_every;
  if (!snapshot_ || key_applied_.empty() ||
      options_.consistency != Consistency::kBsp || workers_lost_.load() > 0) {
    return;
  }
  const auto [lo, hi] =
      std::minmax_element(key_applied_.begin(), key_applied_.end());
  if (*lo != *hi || *lo <= last_snapshot_) return;
  const bool asked = snapshot_at_.erase(*lo) > 0;
  if (!asked && (every == 0 || *lo % every != 0)) return;
  last_snapshot_ = *lo;
  snapshot_(*lo, weights_.data(), weights_.size());
}

size_t DenseShard::Impl::SliceOffset(Key k) const {
  if (k >= end_key_) return weights_.size();
  return layout_.offset(k) - layout_.offset(first_key_);
}

void DenseShard::Impl::AnswerPull(const KVMeta& meta, const SArray<Key>& keys,
                                  int step) {
  size_t total = 0;
  bool uniform = true;
  for (Key k : keys) {
    size_t offset, length;
    if (!Locate(k, &offset, &length)) {
      return Reject(meta, "key " + std::to_string(k) + " is not in [" +
                              std::to_string(first_key_) + ", " +
                              std::to_string(end_key_) + ")");
    }
    total += length;
    uniform = uniform && length == layout_.chunk;
  }
  if (options_.consistency != Consistency::kAsync) {
    int missing = 0;
    for (Key k : keys) {
      missing = std::max(missing, step - key_applied_[k - first_key_]);
    }
    if (missing > max_staleness_.load()) max_staleness_.store(missing);
  }
  // Sorted keys that are contiguous (the usual pull: a whole shard or a
  // range of it) are one segment of the weights; any other subset is
  // gathered into a new buffer.
  KVPairs<float> res;
  res.keys = keys;
  if (!uniform) res.lens.resize(keys.size());
  size_t first = 0, length = 0;
  bool contiguous = !keys.empty() && Locate(keys[0], &first, &length);
  size_t next = first;
  for (size_t i = 0; i < keys.size(); ++i) {
    size_t offset;
    Locate(keys[i], &offset, &length);
    contiguous = contiguous && offset == next;
    next = offset + length;
    if (!uniform) res.lens[i] = static_cast<int>(length);
  }
  if (contiguous) {
    res.vals = weights_.segment(first, first + total);
  } else {
    res.vals.resize(total);
    float* dst = res.vals.data();
    for (Key k : keys) {
      size_t offset;
      Locate(k, &offset, &length);
      std::memcpy(dst, weights_.data() + offset, length * sizeof(float));
      dst += length;
    }
  }
  server_->Response(meta, res);
}

bool DenseShard::Impl::Locate(Key k, size_t* offset, size_t* length) const {
  if (k < first_key_ || k >= end_key_) return false;
  *offset = layout_.offset(k) - layout_.offset(first_key_);
  *length = layout_.length(k);
  return true;
}

float* DenseShard::Impl::MutableWeights() {
  if (weights_.ptr().use_count() > 1) {
    SArray<float> fresh;
    fresh.CopyFrom(weights_);
    weights_ = fresh;
    ++weight_copies_;
  }
  return weights_.data();
}

void DenseShard::Impl::Reject(const KVMeta& meta, const std::string& why) {
  ++bad_requests_;
  LOG(WARNING) << "dense shard: refused a request of "
               << DescribeId(meta.sender) << ": " << why;
  server_->ResponseError(meta, Status::InvalidArgument(why));
}

DenseShard::DenseShard(KVServer<float>* server, const DenseLayout& layout,
                       Key first_key, Key end_key, std::vector<float> weights,
                       const DenseShardOptions& options, DenseUpdater updater,
                       DenseSnapshot snapshot)
    : impl_(std::make_unique<Impl>(server, layout, first_key, end_key,
                                   std::move(weights), options,
                                   std::move(updater), std::move(snapshot))) {}
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
