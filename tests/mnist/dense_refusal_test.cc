// What a DenseShard refuses, on an in-process cluster: every refusal
// reaches the requester as an error naming why. A request the shard cannot
// parse is refused alone; a gradient it cannot sum (out of its keys, cut
// otherwise than the other workers', non-finite, or further ahead than the
// consistency model allows: what a member holding the key could send)
// stops the shard, because the workers waiting on that step would wait
// forever for a live member that will not send it again. Their pulls fail
// at once, naming the member.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../core/cluster.h"
#include "ps/dense_server.h"
#include "ps/kv_app.h"

namespace ps {
namespace {

// 10 floats in keys of 4: key 2 is short (2 floats).
const DenseLayout kLayout{10, 4};

void SubtractMean(float* w, const float* g, size_t, size_t len, int num_grads,
                  int, int) {
  for (size_t i = 0; i < len; ++i) w[i] -= g[i] / num_grads;
}

int Step(int step) { return EncodeDenseCmd(DenseOp::kStep, step); }

::testing::AssertionResult Names(const Status& st, const std::string& what) {
  if (st.message().find(what) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "'" << st.ToString() << "' does not say '" << what << "'";
}

// A request the shard cannot parse fails the worker's Wait with the reason
// and the shard keeps serving; a gradient out of its keys stops it.
TEST(DenseRefusal, RejectedRequestsFailTheWait) {
  Cluster cluster(1, 1);
  ASSERT_TRUE(cluster.Start());
  KVServer<float> server(cluster.servers[0].get(), 0);
  DenseShard shard(&server, kLayout, 0, 2, std::vector<float>(8, 0.0f),
                   DenseShardOptions{Consistency::kBsp, 0, 1}, SubtractMean);
  {
    KVWorker<float> kv(cluster.workers[0].get(), 0, 0);
    Status st = kv.Wait(kv.Push({0}, std::vector<float>(4, 1.0f), {}, 7 << 28));
    EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
    EXPECT_TRUE(Names(st, "server 0 (tcp://"));
    EXPECT_TRUE(Names(st, "no dense-shard command"));
    EXPECT_TRUE(
        kv.Wait(kv.Push({0, 1}, std::vector<float>(8, 1.0f), {}, Step(0)))
            .ok());
    st = kv.Wait(kv.Push({2}, {1.0f, 1.0f}, {2}, Step(1)));
    EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
    EXPECT_TRUE(Names(st, "leaves the shard [0, 2)"));
    st = kv.Wait(kv.Push({0, 1}, std::vector<float>(8, 1.0f), {}, Step(1)));
    EXPECT_EQ(st.code(), Status::kPeerFailed) << st;
  }
  EXPECT_FALSE(shard.WaitAllDone(std::chrono::seconds(10)));
  EXPECT_EQ(shard.failure().code(), Status::kPeerFailed);
  EXPECT_TRUE(Names(shard.failure(),
                    "the dense shard stopped serving steps: it refused the "
                    "gradient of step 1 of worker 0: a gradient push leaves "
                    "the shard [0, 2)"));
  EXPECT_EQ(shard.bad_requests(), 2);
  EXPECT_EQ(shard.updates_applied(), 1);
  for (float w : shard.weights()) EXPECT_EQ(w, -1.0f);
  EXPECT_TRUE(cluster.Finalize());
}

// A member with the key pushes step 0 cut into other ranges than the
// honest worker's: it is refused naming the honest worker's range, and the
// honest worker's pull of step 1, already waiting, fails at once naming
// the member.
TEST(DenseRefusal, AGradientCutOtherwiseStopsTheShardNamingTheMember) {
  Cluster cluster(1, 2);
  ASSERT_TRUE(cluster.Start());
  KVServer<float> server(cluster.servers[0].get(), 0);
  DenseShard shard(&server, kLayout, 0, 3, std::vector<float>(10, 0.0f),
                   DenseShardOptions{Consistency::kBsp, 0, 2}, SubtractMean);
  const std::string honest_name =
      "worker " + std::to_string(cluster.workers[0]->rank());
  const std::string member_name =
      "worker " + std::to_string(cluster.workers[1]->rank());
  {
    KVWorker<float> honest(cluster.workers[0].get(), 0, 0);
    KVWorker<float> member(cluster.workers[1].get(), 0, 0);
    const std::vector<Key> keys = {0, 1, 2};
    EXPECT_TRUE(honest
                    .Wait(honest.Push(keys, std::vector<float>(10, 1.0f),
                                      {4, 4, 2}, Step(0)))
                    .ok());
    std::vector<float> w;
    const int pull = honest.Pull(keys, &w, nullptr, Step(1));
    Status st = member.Wait(
        member.Push({0, 1}, std::vector<float>(8, 1.0f), {4, 4}, Step(0)));
    EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
    EXPECT_TRUE(Names(st,
                      "keys [0, 2) of step 0 overlap the range [0, 3) "
                      "that " +
                          honest_name + " pushed, cut otherwise"));
    st = honest.Wait(pull);
    EXPECT_EQ(st.code(), Status::kPeerFailed) << st;
    EXPECT_TRUE(Names(st,
                      "the dense shard stopped serving steps: it refused the "
                      "gradient of step 0 of " +
                          member_name));
    // The whole cut again, now: the shard serves no step any more.
    st = member.Wait(
        member.Push(keys, std::vector<float>(10, 1.0f), {4, 4, 2}, Step(0)));
    EXPECT_EQ(st.code(), Status::kPeerFailed) << st;
  }
  EXPECT_FALSE(shard.WaitAllDone(std::chrono::seconds(10)));
  EXPECT_TRUE(
      Names(shard.failure(), "of " + member_name + ": keys [0, 2) of step 0"));
  EXPECT_EQ(shard.updates_applied(), 0);
  for (float w : shard.weights()) EXPECT_EQ(w, 0.0f);
  EXPECT_TRUE(cluster.Finalize());
}

// A gradient with a NaN, and one pushed further ahead than BSP lets a
// worker be, are refused naming why; nothing of them is summed or
// buffered, and the shard stops. A shard that allows non-finite values
// sums the NaN.
TEST(DenseRefusal, NonFiniteAndFarAheadPushesAreRefused) {
  Cluster cluster(1, 1);
  ASSERT_TRUE(cluster.Start());
  struct Case {
    int step;
    float value;
    const char* why;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Case cases[] = {
      {0, nan,
       "gradient of step 0 for keys [0, 2) holds a non-finite value (nan) "
       "at float 5"},
      {300, 1.0f,
       "gradient of step 300 for keys [0, 2) is ahead of what the "
       "consistency model allows (step 0 is being summed, max_delay 0)"}};
  for (int app = 0; app < 2; ++app) {
    KVServer<float> server(cluster.servers[0].get(), app);
    DenseShard shard(&server, kLayout, 0, 2, std::vector<float>(8, 0.0f),
                     DenseShardOptions{Consistency::kBsp, 0, 1}, SubtractMean);
    {
      KVWorker<float> kv(cluster.workers[0].get(), app, 0);
      std::vector<float> grad(8, 1.0f);
      grad[5] = cases[app].value;
      Status st = kv.Wait(kv.Push({0, 1}, grad, {}, Step(cases[app].step)));
      EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
      EXPECT_TRUE(Names(st, cases[app].why));
    }
    EXPECT_FALSE(shard.WaitAllDone(std::chrono::seconds(10)));
    EXPECT_TRUE(Names(shard.failure(), cases[app].why));
    EXPECT_EQ(shard.bad_requests(), 1);
    EXPECT_EQ(shard.updates_applied(), 0);
    for (float w : shard.weights()) EXPECT_EQ(w, 0.0f);
  }

  KVServer<float> server(cluster.servers[0].get(), 2);
  DenseShardOptions allow{Consistency::kBsp, 0, 1};
  allow.allow_non_finite = true;
  DenseShard lax(&server, kLayout, 0, 2, std::vector<float>(8, 0.0f), allow,
                 SubtractMean);
  {
    KVWorker<float> kv(cluster.workers[0].get(), 2, 0);
    std::vector<float> grad(8, 1.0f);
    grad[5] = nan;
    EXPECT_TRUE(kv.Wait(kv.Push({0, 1}, grad, {}, Step(0))).ok());
    EXPECT_TRUE(
        kv.Wait(kv.Push({0}, {0.0f}, {1}, EncodeDenseCmd(DenseOp::kDone, 1)))
            .ok());
  }
  EXPECT_TRUE(lax.WaitAllDone(std::chrono::seconds(10)));
  EXPECT_EQ(lax.bad_requests(), 0);
  EXPECT_TRUE(std::isnan(lax.weights()[5]));
  EXPECT_TRUE(cluster.Finalize());
}

}  // namespace
}  // namespace ps
