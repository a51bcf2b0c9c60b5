// DenseShard on an in-process cluster (2 servers, 2 workers as threads):
// exact weights after BSP, bounded delay and async runs, staleness within
// tau, workers that stop at different steps, steps pushed in two key ranges
// in different orders, gradients in shared memory that the shard only
// borrows, overlapping ranges rejected, the cmd encoding, and workers that
// die: gone on without (kContinue), or restarted (kRestart: the successor
// rejoins under its rank, resumes where kJoin says and repeats no gradient
// of its predecessor; one that does not rejoin in time fails the shard).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "../core/cluster.h"
#include "ps/dense_server.h"
#include "ps/kv_app.h"
#include "ps/shared_array.h"

namespace ps {
namespace {

// 10 floats in keys of 4: key 2 is short (2 floats).
const DenseLayout kLayout{10, 4};
constexpr int kSteps[2] = {5, 3};  // worker 1 stops early

Placement TwoServers() {
  return Placement::ByBytes({0, 1, 2}, {4, 4, 2}, 2).value();
}

struct Outcome {
  std::vector<float> final_weights;        // the shards' weights at the end
  std::vector<std::vector<float>> pulled;  // worker 0's pull after each step
  int max_staleness[2] = {-1, -1};
  int64_t updates[2] = {-1, -1};
};

// Worker r pushes (r + 1) * (step + 1) to every float at each step; the
// updater subtracts the mean of the pushed gradients. split: each step goes
// in two ranges, keys {0} and {1, 2} (worker 0 sends the second first,
// worker 1 the first), each pulled on its own, and float i gets the
// gradient times (i + 1), so a range applied at the wrong offset shows.
Outcome RunJob(Consistency consistency, int tau, int slow_ms,
               bool split = false) {
  Cluster cluster(2, 2);
  EXPECT_TRUE(cluster.Start());
  Outcome out;
  std::vector<std::unique_ptr<KVServer<float>>> servers;
  std::vector<std::unique_ptr<DenseShard>> shards;
  Placement placement = TwoServers();
  DenseShardOptions options{consistency, tau, 2};
  for (int s = 0; s < 2; ++s) {
    const int rank = cluster.servers[s]->rank();
    Key begin = placement.begin(rank);
    Key end = std::min<Key>(placement.end(rank), 3);
    size_t n = 0;
    for (Key k = begin; k < end; ++k) n += kLayout.length(k);
    servers.push_back(
        std::make_unique<KVServer<float>>(cluster.servers[s].get(), 0));
    shards.push_back(
        std::make_unique<DenseShard>(servers.back().get(), kLayout, begin, end,
                                     std::vector<float>(n, 0.0f), options,
                                     [](float* w, const float* g, size_t,
                                        size_t len, int num_grads, int, int) {
                                       for (size_t i = 0; i < len; ++i)
                                         w[i] -= g[i] / num_grads;
                                     }));
  }
  std::vector<std::thread> workers;
  for (int r = 0; r < 2; ++r) {
    workers.emplace_back([&, r] {
      KVWorker<float> kv(cluster.workers[r].get(), 0, 0);
      kv.SetPlacement(TwoServers());
      SArray<Key> keys(std::vector<Key>{0, 1, 2});
      SArray<int> lens(std::vector<int>{4, 4, 2});
      SArray<float> weights(10), grads(10);
      int rank = cluster.workers[r]->rank();
      // Ranges [0, cut) and [cut, 3) of keys, floats and weights.
      const size_t cut = split ? 1 : 3, cut_float = split ? 4 : 10;
      SArray<float> parts[2] = {weights.segment(0, cut_float),
                                weights.segment(cut_float, 10)};
      for (int step = 0; step < kSteps[rank]; ++step) {
        for (size_t i = 0; i < grads.size(); ++i) {
          grads[i] = (rank + 1.0f) * (step + 1.0f) * (split ? i + 1.0f : 1.0f);
        }
        std::vector<int> ts;
        for (int part : {1 - rank, rank}) {
          const size_t kb = part == 0 ? 0 : cut, ke = part == 0 ? cut : 3;
          if (kb == ke) continue;
          SArray<Key> k = keys.segment(kb, ke);
          ts.push_back(kv.ZPush(
              k, grads.segment(4 * kb, std::min<size_t>(4 * ke, 10)),
              lens.segment(kb, ke), EncodeDenseCmd(DenseOp::kStep, step)));
          ts.push_back(kv.ZPull(k, &parts[part], nullptr,
                                EncodeDenseCmd(DenseOp::kStep, step + 1)));
        }
        for (int t : ts) EXPECT_TRUE(kv.Wait(t).ok());
        if (rank == 0) out.pulled.emplace_back(weights.begin(), weights.end());
        if (rank == 1 && slow_ms > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
        }
      }
      EXPECT_TRUE(kv.Wait(kv.Push({0, 2}, {0.0f, 0.0f}, {},
                                  EncodeDenseCmd(DenseOp::kDone, kSteps[rank])))
                      .ok());
    });
  }
  for (auto& t : workers) t.join();
  for (int s = 0; s < 2; ++s) {
    EXPECT_TRUE(shards[s]->WaitAllDone(std::chrono::seconds(10)));
    out.max_staleness[s] = shards[s]->max_staleness();
    out.updates[s] = shards[s]->updates_applied();
    EXPECT_EQ(shards[s]->bad_requests(), 0);
    // In float order: shard s holds the floats from its first key's on.
    out.final_weights.resize(kLayout.total);
    const Key begin = placement.begin(cluster.servers[s]->rank());
    std::copy(shards[s]->weights().begin(), shards[s]->weights().end(),
              out.final_weights.begin() + kLayout.offset(begin));
  }
  EXPECT_TRUE(cluster.Finalize());
  return out;
}

// Steps 0..2 average 1.5 (s + 1); steps 3 and 4 have worker 0 alone: s + 1.
float BspWeightAfter(int steps) {
  float w = 0;
  for (int s = 0; s < steps; ++s) w -= s < 3 ? 1.5f * (s + 1) : s + 1.0f;
  return w;
}

TEST(DenseShard, BspServesExactlyTheWeightsOfEveryStep) {
  Outcome out = RunJob(Consistency::kBsp, 0, 0);
  ASSERT_EQ(out.pulled.size(), 5u);
  for (int s = 0; s < 5; ++s) {
    for (float v : out.pulled[s]) ASSERT_EQ(v, BspWeightAfter(s + 1)) << s;
  }
  for (float v : out.final_weights) EXPECT_EQ(v, -18.0f);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(out.updates[s], 5);
    EXPECT_EQ(out.max_staleness[s], 0);
  }
}

TEST(DenseShard, BoundedDelayAppliesInOrderWithinTau) {
  Outcome out = RunJob(Consistency::kBounded, 1, 30);
  for (float v : out.final_weights) EXPECT_EQ(v, -18.0f);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(out.updates[s], 5);
    EXPECT_LE(out.max_staleness[s], 1);
  }
  EXPECT_EQ(std::max(out.max_staleness[0], out.max_staleness[1]), 1)
      << "worker 0 never ran ahead of the slow worker";
  // A pull never misses more than one update of what BSP would serve.
  for (int s = 0; s < static_cast<int>(out.pulled.size()); ++s) {
    float got = out.pulled[s][0];
    EXPECT_TRUE(got == BspWeightAfter(s + 1) || got == BspWeightAfter(s))
        << "step " << s << " got " << got;
  }
}

TEST(DenseShard, AsyncAppliesEveryPushScaledByWorkers) {
  Outcome out = RunJob(Consistency::kAsync, 0, 0);
  // Worker 0 pushes 1+2+3+4+5, worker 1 pushes 2*(1+2+3), each halved.
  for (float v : out.final_weights) EXPECT_EQ(v, -13.5f);
  for (int s = 0; s < 2; ++s) EXPECT_EQ(out.updates[s], 8);
}

TEST(DenseShard, BspIsExactWithTwoRangesPushedInDifferentOrders) {
  Outcome out = RunJob(Consistency::kBsp, 0, 0, /*split=*/true);
  ASSERT_EQ(out.pulled.size(), 5u);
  for (int s = 0; s < 5; ++s) {
    for (int i = 0; i < 10; ++i) {
      ASSERT_EQ(out.pulled[s][i], BspWeightAfter(s + 1) * (i + 1))
          << "step " << s << " float " << i;
    }
  }
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(out.final_weights[i], -18.0f * (i + 1));
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(out.updates[s], 5);
    EXPECT_EQ(out.max_staleness[s], 0);
  }
}

TEST(DenseShard, BoundedWithTwoRangesStaysWithinTau) {
  Outcome out = RunJob(Consistency::kBounded, 1, 30, /*split=*/true);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(out.final_weights[i], -18.0f * (i + 1));
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(out.updates[s], 5);
    EXPECT_LE(out.max_staleness[s], 1);
  }
  for (int s = 0; s < static_cast<int>(out.pulled.size()); ++s) {
    for (int i = 0; i < 10; ++i) {
      float got = out.pulled[s][i];
      EXPECT_TRUE(got == BspWeightAfter(s + 1) * (i + 1) ||
                  got == BspWeightAfter(s) * (i + 1))
          << "step " << s << " float " << i << " got " << got;
    }
  }
}

// Gradients pushed from a ps::SharedArray reach the shard as borrowed
// memory (KVMeta::vals_borrowed). Worker 0 runs a step ahead of the slow
// worker 1 (bounded delay 1) and overwrites its gradients before the step
// they belong to is applied, so the shard must have copied them: the final
// weights are exact only if it did. Pulls land in the workers' shared
// weights, written there by the server.
TEST(DenseShard, BorrowedGradientsOfAWorkerAheadAreCopied) {
  const DenseLayout layout{2048, 1024};  // 4 KiB keys: beyond inline frames
  const int kRuns = 4;
  Cluster cluster(1, 2);
  ASSERT_TRUE(cluster.Start());
  KVServer<float> server(cluster.servers[0].get(), 0);
  DenseShard shard(
      &server, layout, 0, 2, std::vector<float>(layout.total, 0.0f),
      {Consistency::kBounded, 1, 2},
      [](float* w, const float* g, size_t, size_t n, int num_grads, int, int) {
        for (size_t i = 0; i < n; ++i) w[i] -= g[i] / num_grads;
      });
  std::vector<std::thread> workers;
  for (int r = 0; r < 2; ++r) {
    workers.emplace_back([&, r] {
      Node* node = cluster.workers[r].get();
      KVWorker<float> kv(node, 0, 0);
      SArray<Key> keys(std::vector<Key>{0, 1});
      SArray<float> grads = SharedArray<float>(layout.total);
      SArray<float> weights = SharedArray<float>(layout.total);
      const float* before = weights.data();
      for (int step = 0; step < kRuns; ++step) {
        std::fill(grads.begin(), grads.end(),
                  (node->rank() + 1.0f) * (step + 1.0f));
        int push =
            kv.ZPush(keys, grads, {}, EncodeDenseCmd(DenseOp::kStep, step));
        int pull = kv.ZPull(keys, &weights, nullptr,
                            EncodeDenseCmd(DenseOp::kStep, step + 1));
        EXPECT_TRUE(kv.Wait(push).ok());
        EXPECT_TRUE(kv.Wait(pull).ok());
        if (node->rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
        }
      }
      EXPECT_EQ(weights.data(), before);
      EXPECT_GT(node->num_shared_frames_sent(), 0u);
      EXPECT_GT(node->num_shared_frames_received(), 0u);
      EXPECT_TRUE(kv.Wait(kv.Push({0}, {0.0f}, {},
                                  EncodeDenseCmd(DenseOp::kDone, kRuns)))
                      .ok());
    });
  }
  for (auto& t : workers) t.join();
  ASSERT_TRUE(shard.WaitAllDone(std::chrono::seconds(10)));
  EXPECT_EQ(shard.max_staleness(), 1) << "worker 0 never ran ahead";
  EXPECT_EQ(shard.updates_applied(), kRuns);
  // Each step's mean gradient is 1.5 * (step + 1): 1.5 * (1 + 2 + 3 + 4).
  for (float w : shard.weights()) ASSERT_EQ(w, -15.0f);
  EXPECT_EQ(shard.bad_requests(), 0);
  EXPECT_TRUE(cluster.Finalize());
}

// Replication through sockets (PS_REPLICAS=1, PS_SHM=0): each server
// forwards the pushes to its keys to its replica, and its shard adopts the
// received frame of a step's first push as the step's sum and adds the
// other worker's into it, in place, while ZeroMQ may still be sending the
// copy (4 MiB a push: it takes a while). The replica must get the bytes the
// workers sent, so that it holds the primary's weights, bit for bit.
TEST(DenseShard, ReplicaHoldsThePrimarysWeightsThroughSockets) {
  const DenseLayout layout{1 << 21, 1 << 16};  // 8 MiB in 32 keys
  const Key num_keys = static_cast<Key>(layout.num_keys());
  const int kRuns = 4;
  Cluster cluster(2, 2, [](Config* c) {
    c->replicas = 1;
    c->shm = false;
    c->resend_timeout_ms = 1000;
  });
  ASSERT_TRUE(cluster.Start());
  std::vector<Key> all(num_keys);
  std::iota(all.begin(), all.end(), Key{0});
  const Placement placement =
      Placement::ByBytes(all, std::vector<uint64_t>(num_keys, 1), 2).value();
  auto sgd = [](float* w, const float* g, size_t, size_t n, int num_grads, int,
                int) {
    for (size_t i = 0; i < n; ++i) w[i] -= 0.01f * g[i] / num_grads;
  };
  // By server index: its own shard, and the replica of its primary's.
  std::vector<std::unique_ptr<KVServer<float>>> servers;
  std::vector<std::unique_ptr<DenseShard>> own, held;
  for (auto& node : cluster.servers) {
    servers.push_back(std::make_unique<KVServer<float>>(node.get(), 0));
    for (int r : {PrimaryOf(node->rank(), 2), node->rank()}) {
      const Key b = placement.begin(r);
      const Key e = std::min(placement.end(r), num_keys);
      DenseShardOptions options{Consistency::kBsp, 0, 2};
      options.replica = r != node->rank();
      (options.replica ? held : own)
          .push_back(std::make_unique<DenseShard>(
              servers.back().get(), layout, b, e,
              std::vector<float>(layout.offset(e) - layout.offset(b), 0.0f),
              options, sgd));
    }
  }
  std::vector<std::thread> workers;
  for (int r = 0; r < 2; ++r) {
    workers.emplace_back([&, r] {
      KVWorker<float> kv(cluster.workers[r].get(), 0, 0);
      kv.SetPlacement(placement);
      SArray<Key> keys(all);
      SArray<float> grads(layout.total), weights(layout.total);
      for (int step = 0; step < kRuns; ++step) {
        for (size_t i = 0; i < grads.size(); ++i) {
          grads[i] = (r + 1.0f) * (step + 1.0f) + i * 1e-6f;
        }
        int push =
            kv.ZPush(keys, grads, {}, EncodeDenseCmd(DenseOp::kStep, step));
        int pull = kv.ZPull(keys, &weights, nullptr,
                            EncodeDenseCmd(DenseOp::kStep, step + 1));
        EXPECT_TRUE(kv.Wait(push).ok());
        EXPECT_TRUE(kv.Wait(pull).ok());
      }
      EXPECT_TRUE(kv.Wait(kv.Push({0, num_keys - 1}, {0.0f, 0.0f}, {},
                                  EncodeDenseCmd(DenseOp::kDone, kRuns)))
                      .ok());
    });
  }
  for (auto& t : workers) t.join();
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(own[i]->WaitAllDone(std::chrono::seconds(30)));
    ASSERT_TRUE(held[i]->WaitAllDone(std::chrono::seconds(30)));
  }
  // Server i's own keys are held by the other server (2 servers).
  for (size_t i = 0; i < 2; ++i) {
    const SArray<float>& primary = own[i]->weights();
    const SArray<float>& replica = held[1 - i]->weights();
    EXPECT_EQ(own[i]->updates_applied(), kRuns);
    EXPECT_EQ(held[1 - i]->updates_applied(), kRuns);
    ASSERT_EQ(primary.size(), replica.size());
    EXPECT_EQ(std::memcmp(primary.data(), replica.data(),
                          primary.size() * sizeof(float)),
              0)
        << "the replica of server " << cluster.servers[i]->rank()
        << " holds other weights";
  }
  EXPECT_TRUE(cluster.Finalize());
  own.clear();
  held.clear();
}

// Ranges of one step apply at their offsets once both workers sent them
// (in different orders). (A range cut otherwise: dense_refusal_test.cc.)
TEST(DenseShard, RangesOfAStepApplyAtTheirOffsets) {
  Cluster cluster(1, 2);
  ASSERT_TRUE(cluster.Start());
  KVServer<float> server(cluster.servers[0].get(), 0);
  DenseShard shard(&server, kLayout, 0, 3, std::vector<float>(10, 0.0f),
                   DenseShardOptions{Consistency::kBsp, 0, 2},
                   [](float* w, const float* g, size_t offset, size_t len,
                      int num_grads, int, int) {
                     for (size_t i = 0; i < len; ++i) {
                       w[i] -= g[i] / num_grads + 100.0f * offset;
                     }
                   });
  {
    std::unique_ptr<KVWorker<float>> kv[2];
    for (int r = 0; r < 2; ++r) {
      kv[r] = std::make_unique<KVWorker<float>>(cluster.workers[r].get(), 0, 0);
      kv[r]->SetPlacement(Placement::ByBytes({0, 1, 2}, {4, 4, 2}, 1).value());
    }
    const int step0 = EncodeDenseCmd(DenseOp::kStep, 0);
    auto push = [&](int r, std::vector<Key> keys, float g) {
      const size_t n = keys[0] == 0 ? 4 * keys.size() : 6;
      std::vector<int> lens;
      for (Key k : keys) lens.push_back(static_cast<int>(kLayout.length(k)));
      return kv[r]->Wait(
          kv[r]->Push(keys, std::vector<float>(n, g), lens, step0));
    };
    EXPECT_TRUE(push(0, {1, 2}, 1.0f).ok());
    EXPECT_TRUE(push(1, {0}, 6.0f).ok());
    EXPECT_TRUE(push(1, {1, 2}, 3.0f).ok());
    EXPECT_EQ(shard.updates_applied(), 0);  // key 0 waits for worker 0
    EXPECT_TRUE(push(0, {0}, 2.0f).ok());
    std::vector<float> w;
    EXPECT_TRUE(kv[0]
                    ->Wait(kv[0]->Pull({0, 1, 2}, &w, nullptr,
                                       EncodeDenseCmd(DenseOp::kStep, 1)))
                    .ok());
    // Key 0 (offset 0): mean 4; keys 1, 2 (offset 4): mean 2, plus 400.
    EXPECT_EQ(w, (std::vector<float>{-4, -4, -4, -4, -402, -402, -402, -402,
                                     -402, -402}));
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(kv[r]
                      ->Wait(kv[r]->Push({0}, {0.0f}, {1},
                                         EncodeDenseCmd(DenseOp::kDone, 1)))
                      .ok());
    }
  }
  EXPECT_TRUE(shard.WaitAllDone(std::chrono::seconds(10)));
  EXPECT_EQ(shard.updates_applied(), 1);
  EXPECT_EQ(shard.bad_requests(), 0);
  EXPECT_TRUE(cluster.Finalize());
}

TEST(DenseShard, CmdRoundTrips) {
  int cmd = EncodeDenseCmd(DenseOp::kDone, kMaxDenseStep, kMaxDenseTag);
  auto c = DecodeDenseCmd(cmd);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->op, DenseOp::kDone);
  EXPECT_EQ(c->step, kMaxDenseStep);
  EXPECT_EQ(c->tag, kMaxDenseTag);
  EXPECT_FALSE(DecodeDenseCmd(-1).ok());
  EXPECT_FALSE(DecodeDenseCmd(7 << 28).ok());
  EXPECT_FALSE(ParseConsistency("eventual").ok());
  EXPECT_EQ(ParseConsistency("bounded").value(), Consistency::kBounded);
}

void SubtractMean(float* w, const float* g, size_t, size_t len, int num_grads,
                  int, int) {
  for (size_t i = 0; i < len; ++i) w[i] -= g[i] / num_grads;
}

// A shard destroyed before its KVServer unregisters its handler: a later
// request is refused, not run on the destroyed shard (the ASan build shows
// a use after free otherwise).
TEST(DenseShard, ShardDestroyedBeforeItsServer) {
  Cluster cluster(1, 1, [](Config* cfg) {
    cfg->connect_timeout_ms = 300;
    cfg->request_timeout_ms = 10000;
  });
  ASSERT_TRUE(cluster.Start());
  KVServer<float> server(cluster.servers[0].get(), 0);
  auto shard = std::make_unique<DenseShard>(
      &server, kLayout, 0, 2, std::vector<float>(8, 0.0f),
      DenseShardOptions{Consistency::kBsp, 0, 1}, SubtractMean);
  KVWorker<float> kv(cluster.workers[0].get(), 0, 0);
  std::vector<float> w;
  ASSERT_TRUE(
      kv.Wait(kv.Pull({0, 1}, &w, nullptr, EncodeDenseCmd(DenseOp::kStep, 0)))
          .ok());
  shard.reset();
  Status st = kv.Wait(kv.Push({0, 1}, std::vector<float>(8, 1.0f), {},
                              EncodeDenseCmd(DenseOp::kStep, 0)));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.code(), Status::kTimeout) << st;
  EXPECT_TRUE(cluster.Finalize());
}

// kContinue: worker 1 dies (its node stops without Finalize: the scheduler
// tells the others at once) in step 3 after pushing only key 0 of it. Key
// 0's step-3 update averages both gradients that arrived, key 1's has
// worker 0's alone, and step 4 waits for worker 0 only. Each worker pushes
// keys {0} and {1} as two ranges, worker r the gradient (r + 1) * (step + 1).
TEST(DenseShard, ContinueGoesOnWithoutADeadWorker) {
  Cluster cluster(1, 2);
  ASSERT_TRUE(cluster.Start());
  KVServer<float> server(cluster.servers[0].get(), 0);
  DenseShardOptions options{Consistency::kBsp, 0, 2};
  options.on_worker_failure = WorkerFailure::kContinue;
  DenseShard shard(&server, kLayout, 0, 2, std::vector<float>(8, 0.0f), options,
                   SubtractMean);
  std::vector<std::vector<float>> pulled;  // worker 0's, after each step
  std::vector<std::thread> workers;
  for (int r = 0; r < 2; ++r) {
    workers.emplace_back([&, r] {
      Node* node = cluster.workers[r].get();
      const int rank = node->rank();
      {
        KVWorker<float> kv(node, 0, 0);
        for (int step = 0; step < (rank == 0 ? 5 : 4); ++step) {
          const float g = (rank + 1.0f) * (step + 1.0f);
          std::vector<float> w(8);
          std::vector<int> ts;
          for (Key k : {Key{0}, Key{1}}) {
            if (rank == 1 && step == 3 && k == 1) break;  // dies here
            ts.push_back(kv.Push({k}, std::vector<float>(4, g), {4},
                                 EncodeDenseCmd(DenseOp::kStep, step)));
          }
          if (rank == 1 && step == 3) {
            for (int t : ts) EXPECT_TRUE(kv.Wait(t).ok());
            break;
          }
          ts.push_back(kv.Pull({0, 1}, &w, nullptr,
                               EncodeDenseCmd(DenseOp::kStep, step + 1)));
          for (int t : ts) EXPECT_TRUE(kv.Wait(t).ok()) << "step " << step;
          if (rank == 0) pulled.push_back(w);
        }
        if (rank == 0) {
          EXPECT_TRUE(kv.Wait(kv.Push({0}, {0.0f}, {1},
                                      EncodeDenseCmd(DenseOp::kDone, 5)))
                          .ok());
        }
      }
      if (rank == 1) node->Stop();  // no Finalize: a failure
    });
  }
  for (auto& t : workers) t.join();
  ASSERT_TRUE(shard.WaitAllDone(std::chrono::seconds(10)));
  EXPECT_TRUE(shard.failure().ok()) << shard.failure();
  EXPECT_EQ(shard.workers_lost(), 1);
  EXPECT_EQ(shard.updates_applied(), 5);
  ASSERT_EQ(pulled.size(), 5u);
  for (int s = 0; s < 3; ++s) {
    for (float v : pulled[s]) EXPECT_EQ(v, BspWeightAfter(s + 1)) << s;
  }
  // Step 3: key 0 gets the mean of 4 and 8, key 1 worker 0's 4.
  const float after2 = BspWeightAfter(3);  // -9
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(pulled[3][i], after2 - (i < 4 ? 6.0f : 4.0f)) << i;
    EXPECT_EQ(pulled[4][i], after2 - (i < 4 ? 6.0f : 4.0f) - 5.0f) << i;
    EXPECT_EQ(shard.weights()[i], pulled[4][i]);
  }
  EXPECT_EQ(shard.bad_requests(), 0);
  // The dead worker cannot join the final barrier: the nodes just stop.
}

// kRestart: PS_MAX_RESTARTS=1 on every node, 2 servers (the shards of
// TwoServers()) and 2 workers. Every worker pushes each key {0}, {1}, {2}
// as a range of its own, worker r the gradient (r + 1) * (step + 1) *
// (key + 1) (integers: the sums are exact), and the updater subtracts the
// summed gradient and records each update. Steps 0 and 1 run with both
// workers; in step 2 worker 1 pushes key 1 only and dies (its node stops
// without Finalize).
struct RestartJob {
  static constexpr int kDeathStep = 2;
  static constexpr Key kKeyPushedBeforeDeath = 1;

  struct Update {
    int step;
    Key key;
    int num_grads;
  };

  explicit RestartJob(int rejoin_timeout_ms)
      : tweak([rejoin_timeout_ms](Config* c) {
          c->max_restarts = 1;
          c->rejoin_timeout_ms = rejoin_timeout_ms;
        }),
        cluster(2, 2, tweak) {}

  // Starts the nodes and the shards; steps 0 and 1 with both workers, then
  // worker 1's part of step 2 and its death. False (with the failures
  // reported) where that went wrong.
  bool StartAndKillWorker1() {
    if (!cluster.Start()) return false;
    for (int s = 0; s < 2; ++s) {
      const int rank = cluster.servers[s]->rank();
      const Key begin = placement.begin(rank);
      const Key end = std::min<Key>(placement.end(rank), 3);
      first_keys.push_back(begin);
      size_t n = 0;
      for (Key k = begin; k < end; ++k) n += kLayout.length(k);
      DenseShardOptions options{Consistency::kBsp, 0, 2};
      options.on_worker_failure = WorkerFailure::kRestart;
      servers.push_back(
          std::make_unique<KVServer<float>>(cluster.servers[s].get(), 0));
      shards.push_back(std::make_unique<DenseShard>(
          servers.back().get(), kLayout, begin, end,
          std::vector<float>(n, 0.0f), options,
          [this, begin](float* w, const float* g, size_t offset, size_t len,
                        int num_grads, int step, int) {
            for (size_t i = 0; i < len; ++i) w[i] -= g[i];
            std::lock_guard<std::mutex> lock(updates_mu);
            updates.push_back({step,
                               begin + static_cast<Key>(offset / kLayout.chunk),
                               num_grads});
          }));
    }
    std::sort(first_keys.begin(), first_keys.end());
    for (auto& w : cluster.workers) {
      (w->rank() == 0 ? worker0 : worker1) = w.get();
    }
    if (worker0 == nullptr || worker1 == nullptr) {
      ADD_FAILURE() << "no workers of ranks 0 and 1";
      return false;
    }
    kv0 = MakeKV(worker0);
    auto kv1 = MakeKV(worker1);
    for (int step = 0; step < kDeathStep; ++step) {
      std::vector<float> w0, w1;
      int pull0 = PushStepAndPull(kv0.get(), 0, step, &w0);
      int pull1 = PushStepAndPull(kv1.get(), 1, step, &w1);
      Status st0 = kv0->Wait(pull0), st1 = kv1->Wait(pull1);
      if (!st0.ok() || !st1.ok()) {
        ADD_FAILURE() << "step " << step << ": " << st0 << "; " << st1;
        return false;
      }
      if (w0 != WeightsAfter(step + 1) || w1 != WeightsAfter(step + 1)) {
        ADD_FAILURE() << "wrong weights after step " << step;
        return false;
      }
    }
    Status st =
        kv1->Wait(Push(kv1.get(), 1, kDeathStep, kKeyPushedBeforeDeath));
    if (!st.ok()) {
      ADD_FAILURE() << "worker 1's last push: " << st;
      return false;
    }
    kv1.reset();
    stopped_at = std::chrono::steady_clock::now();
    worker1->Stop();  // no Finalize: a failure
    return true;
  }

  // The configuration of a new process of worker 1 (PS_RANK=1).
  Config SuccessorConfig() {
    Config c = TestConfig(Role::kWorker, 2, 2);
    c.root_port = cluster.scheduler->port();
    tweak(&c);
    c.rank = 1;
    return c;
  }

  std::unique_ptr<KVWorker<float>> MakeKV(Node* node) {
    auto kv = std::make_unique<KVWorker<float>>(node, 0, 0);
    kv->SetPlacement(TwoServers());
    return kv;
  }

  static float Grad(int rank, int step, Key key) {
    return (rank + 1.0f) * (step + 1.0f) * (key + 1.0f);
  }

  // Worker `rank`'s push of `key` in `step`; the timestamp.
  static int Push(KVWorker<float>* kv, int rank, int step, Key key) {
    const int len = static_cast<int>(kLayout.length(key));
    return kv->Push({key}, std::vector<float>(len, Grad(rank, step, key)),
                    {len}, EncodeDenseCmd(DenseOp::kStep, step));
  }

  // Pushes the three keys of `step` (each Wait must succeed), then pulls
  // the weights of step + 1 into *w: the pull's timestamp.
  static int PushStepAndPull(KVWorker<float>* kv, int rank, int step,
                             std::vector<float>* w,
                             const std::function<void()>& on_pulled = nullptr) {
    for (Key k = 0; k < 3; ++k) {
      Status st = kv->Wait(Push(kv, rank, step, k));
      EXPECT_TRUE(st.ok()) << "worker " << rank << " step " << step << " key "
                           << k << ": " << st;
    }
    return kv->Pull({0, 1, 2}, w, nullptr,
                    EncodeDenseCmd(DenseOp::kStep, step + 1), on_pulled);
  }

  // kDone after `steps` steps, to every shard.
  Status Done(KVWorker<float>* kv, int steps) {
    return kv->Wait(kv->Push(first_keys, std::vector<float>(2, 0.0f), {1, 1},
                             EncodeDenseCmd(DenseOp::kDone, steps)));
  }

  // Every float of key k after `steps` steps with both workers' gradients:
  // -(1 + 2) * (k + 1) * (1 + ... + steps).
  static std::vector<float> WeightsAfter(int steps) {
    std::vector<float> w;
    for (Key k = 0; k < 3; ++k) {
      const float v = -3.0f * (k + 1.0f) * (steps * (steps + 1) / 2.0f);
      w.insert(w.end(), kLayout.length(k), v);
    }
    return w;
  }

  // The shards' weights in float order.
  std::vector<float> ShardWeights() {
    std::vector<float> all(kLayout.total);
    for (int s = 0; s < 2; ++s) {
      const Key begin = placement.begin(cluster.servers[s]->rank());
      std::copy(shards[s]->weights().begin(), shards[s]->weights().end(),
                all.begin() + kLayout.offset(begin));
    }
    return all;
  }

  std::function<void(Config*)> tweak;
  Cluster cluster;
  Placement placement = TwoServers();
  std::vector<Key> first_keys;  // one key of each shard, ascending
  std::mutex updates_mu;
  std::vector<Update> updates;
  std::vector<std::unique_ptr<KVServer<float>>> servers;
  std::vector<std::unique_ptr<DenseShard>> shards;
  Node* worker0 = nullptr;
  Node* worker1 = nullptr;  // stopped by StartAndKillWorker1
  std::chrono::steady_clock::time_point stopped_at;  // just before
  std::unique_ptr<KVWorker<float>> kv0;
};

// A new process of worker 1 (PS_RANK=1) rejoins while worker 0's pull of
// step 3 waits: kJoin answers step 2 on both shards (each has a key that
// still waits for step 2), the successor pushes all of step 2 again, and
// key 1, which its predecessor pushed and which was applied already, is
// answered but not summed a second time. Every update has both workers'
// gradients; worker 0's pull is answered; the job finishes and all nodes,
// the successor in place of the dead process, pass the final barrier.
TEST(DenseShard, RestartedWorkerRejoinsAndResumes) {
  RestartJob job(/*rejoin_timeout_ms=*/20000);
  ASSERT_TRUE(job.StartAndKillWorker1());
  const int t = RestartJob::kDeathStep;
  // Worker 0 pushes step t whole; its pull of t + 1 waits for worker 1.
  std::atomic<bool> pulled0{false};
  std::vector<float> w0;
  const int pull0 = RestartJob::PushStepAndPull(job.kv0.get(), 0, t, &w0,
                                                [&] { pulled0 = true; });
  for (auto& shard : job.shards) {
    EXPECT_TRUE(shard->failure().ok()) << shard->failure();
  }

  auto successor = std::make_unique<Node>(job.SuccessorConfig());
  const auto registered = std::chrono::steady_clock::now();
  Status st = successor->Start();
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_LT(std::chrono::steady_clock::now() - registered,
            std::chrono::seconds(10));
  EXPECT_TRUE(successor->rejoined());
  EXPECT_EQ(successor->rank(), 1);
  EXPECT_EQ(successor->id(), job.worker1->id());
  EXPECT_FALSE(job.worker0->rejoined());
  {
    auto kv = job.MakeKV(successor.get());
    // Where to resume: one key of each shard, one float each.
    std::vector<float> resume;
    std::vector<int> lens;
    st = kv->Wait(kv->Pull(job.first_keys, &resume, &lens,
                           EncodeDenseCmd(DenseOp::kJoin, 0)));
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(lens, (std::vector<int>{1, 1}));
    EXPECT_EQ(resume, (std::vector<float>{static_cast<float>(t),
                                          static_cast<float>(t)}));
    for (auto& shard : job.shards) EXPECT_EQ(shard->workers_rejoined(), 1);
    EXPECT_FALSE(pulled0) << "worker 0's pull of step " << t + 1
                          << " was answered without worker 1's gradients";
    // Step t again, all three keys.
    std::vector<float> w1;
    st = kv->Wait(RestartJob::PushStepAndPull(kv.get(), 1, t, &w1));
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(w1, RestartJob::WeightsAfter(t + 1));
    st = job.kv0->Wait(pull0);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(pulled0);
    EXPECT_EQ(w0, RestartJob::WeightsAfter(t + 1));
    // One more step together, then done.
    w0.clear();
    w1.clear();
    const int p0 = RestartJob::PushStepAndPull(job.kv0.get(), 0, t + 1, &w0);
    const int p1 = RestartJob::PushStepAndPull(kv.get(), 1, t + 1, &w1);
    EXPECT_TRUE(job.kv0->Wait(p0).ok());
    EXPECT_TRUE(kv->Wait(p1).ok());
    EXPECT_EQ(w0, RestartJob::WeightsAfter(t + 2));
    EXPECT_EQ(w1, RestartJob::WeightsAfter(t + 2));
    EXPECT_TRUE(job.Done(job.kv0.get(), t + 2).ok());
    EXPECT_TRUE(job.Done(kv.get(), t + 2).ok());
  }
  for (auto& shard : job.shards) {
    EXPECT_TRUE(shard->WaitAllDone(std::chrono::seconds(10)));
    EXPECT_TRUE(shard->failure().ok()) << shard->failure();
    EXPECT_EQ(shard->workers_rejoined(), 1);
    EXPECT_EQ(shard->workers_lost(), 0);
    EXPECT_EQ(shard->updates_applied(), t + 2);
    EXPECT_EQ(shard->bad_requests(), 0);
  }
  EXPECT_EQ(job.ShardWeights(), RestartJob::WeightsAfter(t + 2));
  {
    std::lock_guard<std::mutex> lock(job.updates_mu);
    // Each key once a step, each update with both workers' gradients.
    std::set<std::pair<int, Key>> seen;
    for (const RestartJob::Update& u : job.updates) {
      EXPECT_EQ(u.num_grads, 2) << "step " << u.step << " key " << u.key;
      EXPECT_TRUE(seen.insert({u.step, u.key}).second)
          << "step " << u.step << " key " << u.key << " updated twice";
    }
    EXPECT_EQ(job.updates.size(), static_cast<size_t>(3 * (t + 2)));
  }
  // The successor takes the dead process's place in the final barrier.
  job.kv0.reset();
  std::vector<Node*> live{job.cluster.scheduler.get(), job.worker0,
                          successor.get()};
  for (auto& s : job.cluster.servers) live.push_back(s.get());
  std::vector<Status> finalized(live.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < live.size(); ++i) {
    threads.emplace_back([&, i] { finalized[i] = live[i]->Finalize(); });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT_TRUE(finalized[i].ok()) << i << ": " << finalized[i];
  }
}

// The successor's repeat of a push its predecessor made comes before
// worker 0's push of that range (summed, not applied yet): it is answered
// and not summed again, and step 2 applies once worker 0 pushed it.
TEST(DenseShard, RestartedWorkerRepeatsAPushNotAppliedYet) {
  RestartJob job(/*rejoin_timeout_ms=*/20000);
  ASSERT_TRUE(job.StartAndKillWorker1());
  const int t = RestartJob::kDeathStep;
  Node successor(job.SuccessorConfig());
  Status st = successor.Start();
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(successor.rejoined());
  {
    auto kv = job.MakeKV(&successor);
    std::vector<float> resume;
    st = kv->Wait(kv->Pull(job.first_keys, &resume, nullptr,
                           EncodeDenseCmd(DenseOp::kJoin, 0)));
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(resume, (std::vector<float>{static_cast<float>(t),
                                          static_cast<float>(t)}));
    std::atomic<bool> pulled1{false};
    std::vector<float> w0, w1;
    const int pull1 = RestartJob::PushStepAndPull(kv.get(), 1, t, &w1,
                                                  [&] { pulled1 = true; });
    for (auto& shard : job.shards) EXPECT_EQ(shard->updates_applied(), t);
    EXPECT_FALSE(pulled1) << "step " << t << " applied without worker 0";
    const int pull0 = RestartJob::PushStepAndPull(job.kv0.get(), 0, t, &w0);
    EXPECT_TRUE(kv->Wait(pull1).ok());
    EXPECT_TRUE(job.kv0->Wait(pull0).ok());
    EXPECT_EQ(w0, RestartJob::WeightsAfter(t + 1));
    EXPECT_EQ(w1, RestartJob::WeightsAfter(t + 1));
    EXPECT_TRUE(job.Done(job.kv0.get(), t + 1).ok());
    EXPECT_TRUE(job.Done(kv.get(), t + 1).ok());
  }
  for (auto& shard : job.shards) {
    EXPECT_TRUE(shard->WaitAllDone(std::chrono::seconds(10)));
    EXPECT_TRUE(shard->failure().ok()) << shard->failure();
    EXPECT_EQ(shard->workers_rejoined(), 1);
    EXPECT_EQ(shard->updates_applied(), t + 1);
    EXPECT_EQ(shard->bad_requests(), 0);
  }
  EXPECT_EQ(job.ShardWeights(), RestartJob::WeightsAfter(t + 1));
  std::lock_guard<std::mutex> lock(job.updates_mu);
  for (const RestartJob::Update& u : job.updates) {
    EXPECT_EQ(u.num_grads, 2) << "step " << u.step << " key " << u.key;
  }
  EXPECT_EQ(job.updates.size(), static_cast<size_t>(3 * (t + 1)));
}

// Worker 1 died after its push of key 1 in step 2, and worker 0's pushes
// of step 2 applied key 1 (its shard is one update ahead of the other's
// keys). The successor resumes at step 2 and its pull of step 2 gets the
// weights of step 2 for every key, key 1 as it was before that update: the
// gradient it computes on them is the one its predecessor would have
// pushed. A pull for an older step is refused, naming the key.
TEST(DenseShard, RestartedWorkerPullsTheWeightsOfTheStepItResumesAt) {
  RestartJob job(/*rejoin_timeout_ms=*/20000);
  ASSERT_TRUE(job.StartAndKillWorker1());
  const int t = RestartJob::kDeathStep;
  std::vector<float> w0;
  const int pull0 = RestartJob::PushStepAndPull(job.kv0.get(), 0, t, &w0);
  Node successor(job.SuccessorConfig());
  Status st = successor.Start();
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(successor.rejoined());
  {
    auto kv = job.MakeKV(&successor);
    std::vector<float> resume, w1;
    st = kv->Wait(kv->Pull(job.first_keys, &resume, nullptr,
                           EncodeDenseCmd(DenseOp::kJoin, 0)));
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(*std::min_element(resume.begin(), resume.end()),
              static_cast<float>(t));
    st = kv->Wait(
        kv->Pull({0, 1, 2}, &w1, nullptr, EncodeDenseCmd(DenseOp::kStep, t)));
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(w1, RestartJob::WeightsAfter(t));
    std::vector<float> old;
    st = kv->Wait(kv->Pull({RestartJob::kKeyPushedBeforeDeath}, &old, nullptr,
                           EncodeDenseCmd(DenseOp::kStep, t - 1)));
    EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("the weights of step 1 of key 1 are gone: it "
                                "has 3 updates applied"),
              std::string::npos)
        << st;
    w1.clear();
    st = kv->Wait(RestartJob::PushStepAndPull(kv.get(), 1, t, &w1));
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(w1, RestartJob::WeightsAfter(t + 1));
    ASSERT_TRUE(job.kv0->Wait(pull0).ok());
    EXPECT_EQ(w0, RestartJob::WeightsAfter(t + 1));
    EXPECT_TRUE(job.Done(job.kv0.get(), t + 1).ok());
    EXPECT_TRUE(job.Done(kv.get(), t + 1).ok());
  }
  for (auto& shard : job.shards) {
    EXPECT_TRUE(shard->WaitAllDone(std::chrono::seconds(10)));
    EXPECT_TRUE(shard->failure().ok()) << shard->failure();
    EXPECT_EQ(shard->updates_applied(), t + 1);
  }
  EXPECT_EQ(job.ShardWeights(), RestartJob::WeightsAfter(t + 1));
  std::lock_guard<std::mutex> lock(job.updates_mu);
  for (const RestartJob::Update& u : job.updates) {
    EXPECT_EQ(u.num_grads, 2) << "step " << u.step << " key " << u.key;
  }
  EXPECT_EQ(job.updates.size(), static_cast<size_t>(3 * (t + 1)));
}

// Worker 1 dies and no process rejoins under its rank within
// PS_REJOIN_TIMEOUT_MS (1500 ms): it is declared dead a second time, for
// good, and the shards fail as under kStop, naming it; worker 0's pending
// pull is refused with the reason.
TEST(DenseShard, RestartFailsWhenTheWorkerDoesNotRejoinInTime) {
  constexpr int kRejoinTimeoutMs = 1500;
  RestartJob job(kRejoinTimeoutMs);
  ASSERT_TRUE(job.StartAndKillWorker1());
  const auto died = std::chrono::steady_clock::now();
  const int t = RestartJob::kDeathStep;
  std::vector<float> w0;
  const int pull0 = RestartJob::PushStepAndPull(job.kv0.get(), 0, t, &w0);
  // Awaited, not failed, while the timeout runs (unless this machine took
  // that long for the pushes above).
  if (std::chrono::steady_clock::now() - died <
      std::chrono::milliseconds(kRejoinTimeoutMs / 2)) {
    for (auto& shard : job.shards) {
      EXPECT_TRUE(shard->failure().ok()) << shard->failure();
    }
  }
  Status st = job.kv0->Wait(pull0);  // bounded: request_timeout_ms (20 s)
  const auto refused = std::chrono::steady_clock::now();
  EXPECT_EQ(st.code(), Status::kPeerFailed) << st;
  EXPECT_NE(st.message().find("did not rejoin"), std::string::npos) << st;
  EXPECT_NE(st.message().find("PS_REJOIN_TIMEOUT_MS"), std::string::npos) << st;
  EXPECT_NE(st.message().find("worker 1"), std::string::npos) << st;
  EXPECT_GE(refused - job.stopped_at,
            std::chrono::milliseconds(kRejoinTimeoutMs));
  EXPECT_LT(refused - died, std::chrono::seconds(15));
  for (auto& shard : job.shards) {
    EXPECT_FALSE(shard->WaitAllDone(std::chrono::seconds(5)));
    Status f = shard->failure();
    EXPECT_EQ(f.code(), Status::kPeerFailed) << f;
    EXPECT_NE(f.message().find("worker 1"), std::string::npos) << f;
    EXPECT_NE(f.message().find("did not rejoin"), std::string::npos) << f;
    EXPECT_EQ(shard->workers_rejoined(), 0);
    EXPECT_EQ(shard->workers_lost(), 0);
    EXPECT_EQ(shard->updates_applied(), t);
  }
  // Later steps are refused too.
  st = job.kv0->Wait(RestartJob::Push(job.kv0.get(), 0, t + 1, 0));
  EXPECT_EQ(st.code(), Status::kPeerFailed) << st;
  EXPECT_NE(st.message().find("stopped serving steps"), std::string::npos)
      << st;
  // The dead worker cannot join the final barrier: the nodes just stop.
}

// Snapshots every 2 steps carry the weights of exactly that many updates;
// a shard restored from the one of step 4 (first_step) serves it to a pull
// for step 4 and goes on to the weights of an uninterrupted run.
TEST(DenseShard, SnapshotsRestoreToTheSameWeights) {
  Cluster cluster(1, 1);
  ASSERT_TRUE(cluster.Start());
  KVServer<float> server(cluster.servers[0].get(), 0);
  std::map<int, std::vector<float>> snaps;
  DenseShardOptions options{Consistency::kBsp, 0, 1};
  options.snapshot_every = 2;
  auto shard = std::make_unique<DenseShard>(
      &server, kLayout, 0, 2, std::vector<float>(8, 0.0f), options,
      SubtractMean, [&](int step, const float* w, size_t n) {
        snaps[step].assign(w, w + n);
      });
  KVWorker<float> kv(cluster.workers[0].get(), 0, 0);
  auto step = [&](int s) {
    std::vector<float> w;
    EXPECT_TRUE(kv.Wait(kv.Push({0, 1}, std::vector<float>(8, s + 1.0f), {},
                                EncodeDenseCmd(DenseOp::kStep, s)))
                    .ok());
    EXPECT_TRUE(kv.Wait(kv.Pull({0, 1}, &w, nullptr,
                                EncodeDenseCmd(DenseOp::kStep, s + 1)))
                    .ok());
    return w;
  };
  for (int s = 0; s < 5; ++s) step(s);
  ASSERT_EQ(snaps.size(), 2u);
  EXPECT_EQ(snaps[2], std::vector<float>(8, -3.0f));   // -(1 + 2)
  EXPECT_EQ(snaps[4], std::vector<float>(8, -10.0f));  // -(1 + 2 + 3 + 4)
  shard.reset();
  options.first_step = 4;
  shard = std::make_unique<DenseShard>(&server, kLayout, 0, 2, snaps[4],
                                       options, SubtractMean);
  EXPECT_EQ(shard->updates_applied(), 4);
  std::vector<float> w;
  ASSERT_TRUE(
      kv.Wait(kv.Pull({0, 1}, &w, nullptr, EncodeDenseCmd(DenseOp::kStep, 4)))
          .ok());
  EXPECT_EQ(w, std::vector<float>(8, -10.0f));
  EXPECT_EQ(step(4), std::vector<float>(8, -15.0f));
  EXPECT_TRUE(
      kv.Wait(kv.Push({0}, {0.0f}, {1}, EncodeDenseCmd(DenseOp::kDone, 5)))
          .ok());
  EXPECT_TRUE(shard->WaitAllDone(std::chrono::seconds(10)));
  EXPECT_EQ(shard->updates_applied(), 5);
  EXPECT_TRUE(cluster.Finalize());
}

}  // namespace
}  // namespace ps
