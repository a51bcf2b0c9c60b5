// DenseAggregator: per-(step, range) sums and the consistency gate of a
// dense shard (aggregator.h).
#include "kv/aggregator.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>

namespace ps {

DenseAggregator::DenseAggregator(const Options& options, Key first_key,
                                 Key end_key)
    : options_(options),
      first_key_(first_key),
      end_key_(end_key),
      key_applied_(end_key - first_key, options.first_step) {
  CHECK_LE(first_key_, end_key_);
  CHECK_GE(options_.num_workers, 1);
  CHECK_GE(options_.max_delay, 0);
}

DenseAggregator::Verdict DenseAggregator::Push(int worker, int step, int tag,
                                               Key begin, Key end,
                                               const SArray<float>& vals,
                                               bool borrowed,
                                               std::string* why) {
  // The worker is on record from its first push on, refused or not (a lost
  // or restarted worker's step is taken from it).
  int& last = last_push_[worker];
  if (options_.consistency == Consistency::kAsync) {
    last = std::max(last, step);
    return Verdict::kApplyNow;
  }
  if (PushedBefore(worker, step, begin, end)) return Verdict::kRepeated;
  *why = CheckPending(step, begin, end);
  if (why->empty()) *why = CheckAhead(step, begin, end);
  if (why->empty()) *why = CheckFinite(step, begin, end, vals);
  if (!why->empty()) return Verdict::kRefused;
  last = std::max(last, step);
  RangeSum& s = sums_[{step, begin}];
  if (s.count == 0) {
    s.end = end;
    s.tag = tag;
    // A received frame is adopted as the sum (no copy): it is the caller's
    // alone, nothing else reads it once we write into it (KVMeta::
    // vals_borrowed; the replica's copy has its own bytes). So are borrowed
    // values (the worker's shared memory) that ApplyReady applies right
    // after, only read, before the answer lets the worker write them again;
    // other borrowed values are copied.
    if (borrowed && !AppliesAt(step, begin, end, 1)) {
      s.sum.CopyFrom(vals);
    } else {
      s.sum = vals;
    }
  } else {
    const float* g = vals.data();
    for (size_t i = 0; i < s.sum.size(); ++i) s.sum[i] += g[i];
  }
  ++s.count;
  s.from.push_back(worker);
  return Verdict::kSummed;
}

void DenseAggregator::ApplyReady(
    const std::function<void(const Ready&)>& apply) {
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
    CountApplied(begin, s.end);
    Ready ready;
    ready.step = step;
    ready.begin = begin;
    ready.end = s.end;
    ready.sum = s.sum.data();
    ready.num_grads = s.count;
    ready.tag = s.tag;
    apply(ready);
    it = sums_.erase(it);
  }
}

void DenseAggregator::CountApplied(Key begin, Key end) {
  for (Key k = begin; k < end; ++k) ++AppliedOf(k);
}

DenseAggregator::Verdict DenseAggregator::Adopt(int step, Key begin, Key end,
                                                std::string* why) {
  bool past = true, at = true;
  for (Key k = begin; k < end; ++k) {
    past = past && AppliedOf(k) > step;
    at = at && AppliedOf(k) == step;
  }
  if (past) return Verdict::kRepeated;
  if (!at) {
    *why = "the primary's sum of step " + std::to_string(step) + " for keys [" +
           std::to_string(begin) + ", " + std::to_string(end) +
           ") does not follow the steps applied";
    return Verdict::kRefused;
  }
  sums_.erase({step, begin});  // workers' pushes resent before it: in it
  CountApplied(begin, end);
  return Verdict::kApplyNow;
}

bool DenseAggregator::PullReady(const SArray<Key>& keys, int step) const {
  if (options_.consistency == Consistency::kAsync) return true;
  for (Key k : keys) {
    if (k < first_key_ || k >= end_key_) continue;  // the caller refuses it
    const int applied = AppliedOf(k);
    // Nothing can be applied any more once every worker is past its last
    // step.
    if (ExpectedAt(applied) <= 0) continue;
    if (step - applied > options_.max_delay) return false;
  }
  return true;
}

int DenseAggregator::Missing(const SArray<Key>& keys, int step) const {
  int missing = 0;
  for (Key k : keys) missing = std::max(missing, step - AppliedOf(k));
  return missing;
}

bool DenseAggregator::Done(int worker, int steps) {
  return done_steps_.emplace(worker, steps).second;
}

int DenseAggregator::Lose(int worker) {
  if (IsDone(worker) || !dead_.insert(worker).second) return -1;
  auto it = last_push_.find(worker);
  const int step = it == last_push_.end() ? options_.first_step : it->second;
  done_steps_.emplace(worker, step);
  return step;
}

int DenseAggregator::ResumeStep(int worker) const {
  // Under kBsp/kBounded each key has had every step before the least one
  // applied, and a worker pushes no step before it pulled the weights of
  // the one before: it resumes at the least step any key waits for, and
  // what its predecessor pushed of later steps is not summed twice
  // (PushedBefore). kAsync applies pushes as they come: after the last.
  auto done = done_steps_.find(worker);
  if (done != done_steps_.end()) return done->second;
  if (options_.consistency == Consistency::kAsync) {
    auto last = last_push_.find(worker);
    return last == last_push_.end() ? options_.first_step : last->second + 1;
  }
  return LeastApplied();
}

int DenseAggregator::LeastApplied() const {
  if (key_applied_.empty()) return options_.first_step;
  return *std::min_element(key_applied_.begin(), key_applied_.end());
}

bool DenseAggregator::Uniform(int* steps) const {
  if (key_applied_.empty()) return false;
  const auto [lo, hi] =
      std::minmax_element(key_applied_.begin(), key_applied_.end());
  *steps = *lo;
  return *lo == *hi;
}

bool DenseAggregator::PushedBefore(int worker, int step, Key begin,
                                   Key end) const {
  // Summed already (from any worker: a push comes once, the KV layer
  // drops a resent one; twice only from a successor).
  auto s = sums_.find({step, begin});
  if (s != sums_.end()) {
    return std::find(s->second.from.begin(), s->second.from.end(), worker) !=
           s->second.from.end();
  }
  // Applied already: the range waited for every worker, this one included
  // (for a successor's push; any other's is a late one, refused by
  // CheckPending).
  if (restarted_.count(worker) == 0 && !options_.repeats_applied) return false;
  for (Key k = begin; k < end; ++k) {
    if (AppliedOf(k) <= step) return false;
  }
  return begin < end;
}

int DenseAggregator::ExpectedAt(int step) const {
  int n = options_.num_workers;
  for (const auto& [worker, steps] : done_steps_) n -= steps <= step;
  return n;
}

bool DenseAggregator::AppliesAt(int step, Key begin, Key end, int count) const {
  const int expected = ExpectedAt(step);
  if (expected <= 0 || count < expected) return false;
  for (Key k = begin; k < end; ++k) {
    if (AppliedOf(k) != step) return false;
  }
  return true;
}

int DenseAggregator::Counted(const RangeSum& s, int step) const {
  if (dead_.empty()) return s.count;
  int n = 0;
  for (int id : s.from) {
    auto done = done_steps_.find(id);
    n += done == done_steps_.end() || done->second > step;
  }
  return n;
}

std::string DenseAggregator::CheckPending(int step, Key begin, Key end) const {
  for (Key k = begin; k < end; ++k) {
    if (AppliedOf(k) > step) {
      return "gradient of step " + std::to_string(step) + " for key " +
             std::to_string(k) + " arrived after that step was applied";
    }
  }
  for (auto it = sums_.lower_bound({step, 0});
       it != sums_.end() && it->first.first == step; ++it) {
    const Key b = it->first.second, e = it->second.end;
    if ((b != begin || e != end) && b < end && begin < e) {
      std::string who;
      for (int id : it->second.from) {
        who += (who.empty() ? "" : ", ") + DescribeId(id);
      }
      return "keys [" + std::to_string(begin) + ", " + std::to_string(end) +
             ") of step " + std::to_string(step) + " overlap the range [" +
             std::to_string(b) + ", " + std::to_string(e) + ") that " + who +
             " pushed, cut otherwise";
    }
  }
  return "";
}

// Under kBsp and kBounded a worker pushes step s only after it pulled the
// weights of step s - 1 - max_delay, so a push further ahead than that (and
// one step of slack) is refused: the sums buffered per range stay bounded
// by max_delay + 2 steps whatever a member sends.
std::string DenseAggregator::CheckAhead(int step, Key begin, Key end) const {
  int least = AppliedOf(begin);
  for (Key k = begin; k < end; ++k) least = std::min(least, AppliedOf(k));
  const int limit = least + options_.max_delay + 1;
  if (step <= limit) return "";
  return "gradient of step " + std::to_string(step) + " for keys [" +
         std::to_string(begin) + ", " + std::to_string(end) +
         ") is ahead of what the consistency model allows (step " +
         std::to_string(least) + " is being summed, max_delay " +
         std::to_string(options_.max_delay) + ")";
}

// A NaN or an infinity in one gradient ruins every weight it is summed
// into, so it is refused unless allow_non_finite.
std::string DenseAggregator::CheckFinite(int step, Key begin, Key end,
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

}  // namespace ps
