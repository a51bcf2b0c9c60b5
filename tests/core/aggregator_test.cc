// The dense shard's parts fed calls, without sockets: DenseAggregator's
// sums and gate under bsp, bounded and async (pulls held and let go,
// refusals, ordered ranges, lost and restarted workers, adopted or copied
// frames), and DenseSlice's optimizer step, copy on write and pull answers.
#include "kv/aggregator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kv/dense_slice.h"

namespace ps {
namespace {

constexpr int kW0 = 9, kW1 = 11;  // worker ids of ranks 0 and 1

DenseAggregator::Options Opts(Consistency c, int tau = 0, int workers = 2) {
  DenseAggregator::Options o;
  o.consistency = c;
  o.max_delay = tau;
  o.num_workers = workers;
  return o;
}

SArray<float> Vals(std::vector<float> v) { return SArray<float>(v); }
SArray<Key> Keys(std::vector<Key> k) { return SArray<Key>(k); }

// The ranges ApplyReady hands out, as "step:begin-end/num_grads".
std::vector<std::string> Drain(DenseAggregator* a,
                               std::vector<float>* first_sum = nullptr) {
  std::vector<std::string> out;
  a->ApplyReady([&](const DenseAggregator::Ready& r) {
    out.push_back(std::to_string(r.step) + ":" + std::to_string(r.begin) + "-" +
                  std::to_string(r.end) + "/" + std::to_string(r.num_grads));
    if (first_sum != nullptr && first_sum->empty()) {
      first_sum->assign(r.sum, r.sum + (r.end - r.begin));
    }
  });
  return out;
}

using V = DenseAggregator::Verdict;

TEST(DenseAggregator, BspHoldsPullsUntilEveryWorkersGradient) {
  DenseAggregator a(Opts(Consistency::kBsp), 0, 2);
  std::string why;
  const SArray<Key> keys = Keys({0, 1});
  EXPECT_TRUE(a.PullReady(keys, 0));
  EXPECT_FALSE(a.PullReady(keys, 1));
  EXPECT_EQ(a.Push(kW0, 0, 0, 0, 2, Vals({1, 2}), false, &why), V::kSummed);
  EXPECT_TRUE(Drain(&a).empty());  // worker 1's is missing
  EXPECT_FALSE(a.PullReady(keys, 1));
  EXPECT_EQ(a.Push(kW1, 0, 0, 0, 2, Vals({10, 20}), false, &why), V::kSummed);
  std::vector<float> sum;
  EXPECT_EQ(Drain(&a, &sum), std::vector<std::string>{"0:0-2/2"});
  EXPECT_EQ(sum, (std::vector<float>{11, 22}));
  EXPECT_EQ(a.LeastApplied(), 1);
  EXPECT_TRUE(a.PullReady(keys, 1));
  EXPECT_FALSE(a.PullReady(keys, 2));
  EXPECT_EQ(a.Missing(keys, 1), 0);
  EXPECT_EQ(a.pending_sums(), 0u);
}

TEST(DenseAggregator, BoundedLetsPullsRunTauAheadAndAppliesInOrder) {
  // Two ranges; tau 1: step 1 may be summed before step 0 is applied.
  DenseAggregator a(Opts(Consistency::kBounded, 1), 0, 4);
  std::string why;
  EXPECT_TRUE(a.PullReady(Keys({0, 3}), 1));
  EXPECT_FALSE(a.PullReady(Keys({0, 3}), 2));
  for (int w : {kW0, kW1}) {
    EXPECT_EQ(a.Push(w, 1, 0, 2, 4, Vals({1, 1}), false, &why), V::kSummed)
        << why;
  }
  EXPECT_TRUE(Drain(&a).empty());  // step 0 of [2, 4) is not applied yet
  for (int w : {kW0, kW1}) {
    EXPECT_EQ(a.Push(w, 0, 0, 2, 4, Vals({1, 1}), false, &why), V::kSummed);
  }
  // One pass applies step 0, then the step 1 it enabled.
  EXPECT_EQ(Drain(&a), (std::vector<std::string>{"0:2-4/2", "1:2-4/2"}));
  EXPECT_EQ(a.key_applied(), (std::vector<int>{0, 0, 2, 2}));
  // Keys 2 and 3 are ahead, keys 0 and 1 hold a pull of step 2 back.
  EXPECT_TRUE(a.PullReady(Keys({2, 3}), 3));
  EXPECT_FALSE(a.PullReady(Keys({0, 3}), 2));
  EXPECT_EQ(a.Missing(Keys({0, 3}), 1), 1);
  int steps = -1;
  EXPECT_FALSE(a.Uniform(&steps));
  EXPECT_EQ(steps, 0);
}

TEST(DenseAggregator, AsyncAppliesEveryPushAtOnceAndNeverHoldsPulls) {
  DenseAggregator a(Opts(Consistency::kAsync), 0, 2);
  std::string why;
  EXPECT_EQ(a.Push(kW0, 7, 0, 0, 2, Vals({1, 2}), false, &why), V::kApplyNow);
  EXPECT_TRUE(Drain(&a).empty());
  a.CountApplied(0, 2);
  EXPECT_EQ(a.LeastApplied(), 1);
  EXPECT_TRUE(a.PullReady(Keys({0, 1}), 100));
  EXPECT_EQ(a.ResumeStep(kW0), 8);  // after its last push
  EXPECT_EQ(a.ResumeStep(kW1), 0);  // pushed nothing
}

TEST(DenseAggregator, RefusesLateOverlappingFarAheadAndNonFiniteGradients) {
  DenseAggregator a(Opts(Consistency::kBsp, 0, 1), 0, 4);
  std::string why;
  // One step of slack past the least applied step, no more.
  EXPECT_EQ(a.Push(kW0, 2, 0, 0, 4, Vals({0, 0, 0, 0}), false, &why),
            V::kRefused);
  EXPECT_EQ(why,
            "gradient of step 2 for keys [0, 4) is ahead of what the "
            "consistency model allows (step 0 is being summed, max_delay 0)");
  EXPECT_EQ(a.Push(kW0, 1, 0, 0, 2, Vals({0, 0}), false, &why), V::kSummed);
  EXPECT_EQ(a.Push(kW0, 1, 0, 1, 3, Vals({0, 0}), false, &why), V::kRefused);
  EXPECT_EQ(why,
            "keys [1, 3) of step 1 overlap the range [0, 2) that worker 0 "
            "pushed, cut otherwise");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(a.Push(kW0, 0, 0, 2, 4, Vals({1, nan}), false, &why), V::kRefused);
  EXPECT_NE(why.find("gradient of step 0 for keys [2, 4) holds a non-finite "
                     "value (nan) at float 1"),
            std::string::npos)
      << why;
  EXPECT_EQ(a.Push(kW0, 0, 0, 2, 4, Vals({1, 1}), false, &why), V::kSummed);
  EXPECT_EQ(Drain(&a), std::vector<std::string>{"0:2-4/1"});
  EXPECT_EQ(a.Push(kW0, 0, 0, 2, 4, Vals({1, 1}), false, &why), V::kRefused);
  EXPECT_EQ(why,
            "gradient of step 0 for key 2 arrived after that step was "
            "applied");

  DenseAggregator::Options o = Opts(Consistency::kBsp, 0, 1);
  o.allow_non_finite = true;
  DenseAggregator lenient(o, 0, 2);
  EXPECT_EQ(lenient.Push(kW0, 0, 0, 0, 2, Vals({nan, 1}), false, &why),
            V::kSummed);
}

TEST(DenseAggregator, LostWorkerCountsAsDoneAtItsStepInFlight) {
  DenseAggregator a(Opts(Consistency::kBsp), 0, 2);
  std::string why;
  EXPECT_EQ(a.Push(kW1, 0, 0, 0, 2, Vals({5, 5}), false, &why), V::kSummed);
  EXPECT_EQ(a.Lose(kW1), 0);
  EXPECT_EQ(a.Lose(kW1), -1);  // once
  EXPECT_TRUE(a.IsLost(kW1));
  EXPECT_TRUE(a.IsDone(kW1));
  // Its gradient was summed, but the range waits for worker 0's.
  EXPECT_TRUE(Drain(&a).empty());
  EXPECT_EQ(a.Push(kW0, 0, 0, 0, 2, Vals({1, 1}), false, &why), V::kSummed);
  std::vector<float> sum;
  EXPECT_EQ(Drain(&a, &sum), std::vector<std::string>{"0:0-2/2"});
  EXPECT_EQ(sum, (std::vector<float>{6, 6}));
  // Later steps wait for worker 0 only.
  EXPECT_EQ(a.Push(kW0, 1, 0, 0, 2, Vals({1, 1}), false, &why), V::kSummed);
  EXPECT_EQ(Drain(&a), std::vector<std::string>{"1:0-2/1"});
  // Once every worker is past its last step, pulls are never held.
  EXPECT_TRUE(a.Done(kW0, 2));
  EXPECT_FALSE(a.Done(kW0, 2));
  EXPECT_TRUE(a.PullReady(Keys({0, 1}), 9));
}

TEST(DenseAggregator, RestartedWorkersRepeatedPushesAreNotSummedTwice) {
  DenseAggregator a(Opts(Consistency::kBsp), 0, 2);
  std::string why;
  EXPECT_EQ(a.Push(kW0, 0, 0, 0, 2, Vals({1, 1}), false, &why), V::kSummed);
  a.Restarted(kW0);
  // Its successor pushes step 0 again: summed already.
  EXPECT_EQ(a.Push(kW0, 0, 0, 0, 2, Vals({1, 1}), false, &why), V::kRepeated);
  EXPECT_EQ(a.ResumeStep(kW0), 0);
  EXPECT_EQ(a.Push(kW1, 0, 0, 0, 2, Vals({1, 1}), false, &why), V::kSummed);
  EXPECT_EQ(Drain(&a), std::vector<std::string>{"0:0-2/2"});
  // Applied already: answered, not refused as late.
  EXPECT_EQ(a.Push(kW0, 0, 0, 0, 2, Vals({1, 1}), false, &why), V::kRepeated);
  // Worker 1 never died: its late push is refused.
  EXPECT_EQ(a.Push(kW1, 0, 0, 0, 2, Vals({1, 1}), false, &why), V::kRefused);
  EXPECT_EQ(a.ResumeStep(kW0), 1);
  EXPECT_TRUE(a.Done(kW1, 1));
  EXPECT_EQ(a.ResumeStep(kW1), 1);  // its done step
}

TEST(DenseAggregator, FirstPushIsAdoptedUnlessBorrowedAndHeld) {
  std::string why;
  {
    // Applied at once: a borrowed frame is only read, so it is adopted.
    DenseAggregator a(Opts(Consistency::kBsp, 0, 1), 0, 2);
    SArray<float> g = Vals({1, 2});
    EXPECT_EQ(a.Push(kW0, 0, 0, 0, 2, g, true, &why), V::kSummed);
    const float* seen = nullptr;
    a.ApplyReady([&](const DenseAggregator::Ready& r) { seen = r.sum; });
    EXPECT_EQ(seen, g.data());
  }
  {
    // Held for another worker: a borrowed frame is copied, an own one
    // adopted and summed into.
    DenseAggregator a(Opts(Consistency::kBsp), 0, 2);
    SArray<float> borrowed = Vals({1, 2});
    EXPECT_EQ(a.Push(kW0, 0, 0, 0, 2, borrowed, true, &why), V::kSummed);
    EXPECT_EQ(a.Push(kW1, 0, 0, 0, 2, Vals({1, 1}), false, &why), V::kSummed);
    EXPECT_EQ(borrowed[0], 1);  // untouched
    DenseAggregator b(Opts(Consistency::kBsp), 0, 2);
    SArray<float> own = Vals({1, 2});
    EXPECT_EQ(b.Push(kW0, 0, 0, 0, 2, own, false, &why), V::kSummed);
    EXPECT_EQ(b.Push(kW1, 0, 0, 0, 2, Vals({1, 1}), false, &why), V::kSummed);
    EXPECT_EQ(own[0], 2);  // the sum
  }
}

// ---- DenseSlice ------------------------------------------------------

TEST(DenseAggregator, ReplicaAdoptsThePrimarysSumsInStepOrder) {
  DenseAggregator::Options o = Opts(Consistency::kBsp);
  o.repeats_applied = true;
  DenseAggregator a(o, 0, 4);
  std::string why;
  EXPECT_EQ(a.Adopt(1, 0, 2, &why), V::kRefused);  // step 0 not applied
  EXPECT_NE(why.find("does not follow"), std::string::npos) << why;
  why.clear();
  EXPECT_EQ(a.Adopt(0, 0, 2, &why), V::kApplyNow);
  EXPECT_EQ(a.key_applied(), (std::vector<int>{1, 1, 0, 0}));
  EXPECT_EQ(a.Adopt(0, 0, 2, &why), V::kRepeated);  // the sum came again
  EXPECT_TRUE(a.PullReady(Keys({0, 1}), 1));
  EXPECT_FALSE(a.PullReady(Keys({2}), 1));
  // After a takeover, a worker resends its push of the adopted step: a
  // repeat, not a late gradient.
  EXPECT_EQ(a.Push(kW0, 0, 0, 0, 2, Vals({1, 2}), false, &why), V::kRepeated);
  // Its push of a step not adopted yet is summed as the primary's was.
  EXPECT_EQ(a.Push(kW0, 0, 0, 2, 4, Vals({1, 2}), false, &why), V::kSummed);
  EXPECT_EQ(a.Push(kW1, 0, 0, 2, 4, Vals({3, 4}), false, &why), V::kSummed);
  EXPECT_EQ(Drain(&a), std::vector<std::string>{"0:2-4/2"});
}

TEST(DenseAggregator, BspPushOfAnAppliedStepIsRefusedOutsideAReplica) {
  DenseAggregator a(Opts(Consistency::kBsp), 0, 2);
  std::string why;
  EXPECT_EQ(a.Adopt(0, 0, 2, &why), V::kApplyNow);
  EXPECT_EQ(a.Push(kW0, 0, 0, 0, 2, Vals({1, 2}), false, &why), V::kRefused);
}

TEST(DenseSlice, OptimizerStepCopiesWeightsSharedWithAnAnswer) {
  DenseLayout layout{5, 2};  // keys 0, 1 of 2 floats, key 2 of 1
  int calls = 0;
  DenseSlice slice(layout, 1, 3, {1, 2, 3},
                   [&](float* w, const float* g, size_t offset, size_t n,
                       int num_grads, int step, int tag) {
                     ++calls;
                     EXPECT_EQ(offset, 2u);
                     EXPECT_EQ(n, 1u);
                     EXPECT_EQ(num_grads, 2);
                     EXPECT_EQ(step, 4);
                     EXPECT_EQ(tag, 3);
                     w[0] -= g[0];
                   });
  KVPairs<float> res;
  std::string why;
  ASSERT_TRUE(slice.Answer(Keys({1, 2}), &res, &why)) << why;
  EXPECT_EQ(res.vals.data(), slice.weights().data());  // a segment
  ASSERT_EQ(res.lens.size(), 2u);  // lengths differ: given per key
  EXPECT_EQ(res.lens[0], 2);
  EXPECT_EQ(res.lens[1], 1);
  const float g = 1;
  EXPECT_TRUE(slice.Apply(2, 3, &g, 2, 4, 3));  // shared: copied first
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(res.vals[2], 3);  // the answer keeps what it had
  EXPECT_EQ(slice.weights()[2], 2);
  res = KVPairs<float>();
  EXPECT_FALSE(slice.Apply(2, 3, &g, 2, 4, 3));  // ours alone now

  EXPECT_FALSE(slice.Answer(Keys({0}), &res, &why));
  EXPECT_EQ(why, "key 0 is not in [1, 3)");
}

TEST(DenseSlice, PushRangeMustBeAContiguousRunOfTheSlice) {
  DenseLayout layout{8, 2};
  DenseSlice slice(layout, 1, 4, std::vector<float>(6, 0.f), nullptr);
  Key b, e;
  std::string why;
  EXPECT_TRUE(slice.PushRange(Keys({2, 3}), 4, &b, &e, &why)) << why;
  EXPECT_EQ(b, 2u);
  EXPECT_EQ(e, 4u);
  EXPECT_FALSE(slice.PushRange(Keys({}), 0, &b, &e, &why));
  EXPECT_EQ(why, "a gradient push carries no keys");
  EXPECT_FALSE(slice.PushRange(Keys({3, 4}), 4, &b, &e, &why));
  EXPECT_EQ(why, "a gradient push leaves the shard [1, 4)");
  EXPECT_FALSE(slice.PushRange(Keys({1, 3}), 4, &b, &e, &why));
  EXPECT_NE(why.find("contiguous range"), std::string::npos);
  EXPECT_FALSE(slice.PushRange(Keys({1, 2}), 3, &b, &e, &why));
  EXPECT_EQ(why, "a gradient push of keys [1, 3) carries 3 floats");
  // A gathered answer for keys that are not one run.
  KVPairs<float> res;
  ASSERT_TRUE(slice.Answer(Keys({1, 3}), &res, &why));
  EXPECT_EQ(res.vals.size(), 4u);
  EXPECT_NE(res.vals.data(), slice.weights().data());
}

}  // namespace
}  // namespace ps
