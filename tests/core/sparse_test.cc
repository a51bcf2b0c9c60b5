// Sparse tables (ps/sparse.h): the row store and its optimizers against a
// reference written here, the state's round trip, and the shard between
// nodes over sockets: rows pulled in the caller's order, pushes summed and
// applied exactly, refusals, sync points with snapshots, and a replica that
// takes over bit for bit.
#include "ps/sparse.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cluster.h"
#include "gtest/gtest.h"
#include "postoffice/postoffice.h"
#include "sparse/sparse_table.h"

namespace ps {
namespace {

SparseTableConfig Table(int id, int width, SparseOptimizer opt) {
  SparseTableConfig t;
  t.id = id;
  t.width = width;
  t.optimizer = opt;
  return t;
}

TEST(SparseUnit, KeysAreDistinctAndSpreadEvenly) {
  constexpr int kIds = 1 << 20;
  std::set<Key> keys;
  int quarter[4] = {0, 0, 0, 0};
  for (uint64_t id = 0; id < kIds; ++id) {
    Key k = SparseKeyOf(id);
    keys.insert(k);
    ++quarter[k >> 62];
  }
  EXPECT_EQ(keys.size(), static_cast<size_t>(kIds));
  constexpr int kEven = kIds / 4, kSlack = kIds / 100;
  for (int q : quarter) {
    EXPECT_NEAR(q, kEven, kSlack) << "consecutive ids are not spread";
  }
}

TEST(SparseUnit, BatchIsUniqueSortedAndMapsEveryId) {
  const std::vector<uint64_t> ids = {7, 3, 7, 1ull << 50, 3, 3, 0};
  SparseBatch b = SparseBatch::Of(ids.data(), ids.size());
  ASSERT_EQ(b.size(), 4u);
  for (size_t j = 1; j < b.size(); ++j) EXPECT_LT(b.keys[j - 1], b.keys[j]);
  ASSERT_EQ(b.slot.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(b.keys[b.slot[i]], SparseKeyOf(ids[i])) << "id " << ids[i];
  }
}

TEST(SparseUnit, ConfigErrorsNameTheFieldAndValue) {
  SparseTableConfig t = Table(3, 0, SparseOptimizer::kSgd);
  Status st = t.Validate();
  EXPECT_EQ(st.code(), Status::kInvalidArgument);
  EXPECT_NE(st.message().find("sparse table 3: width 0"), std::string::npos)
      << st;
  t.width = 4;
  t.lr = -1;
  st = t.Validate();
  EXPECT_NE(st.message().find("lr -1"), std::string::npos) << st;
  EXPECT_FALSE(ParseSparseOptimizer("adam").ok());
  EXPECT_NE(ParseSparseInit("ones").status().message().find("'ones'"),
            std::string::npos);
}

TEST(SparseUnit, InitIsAPureFunctionOfSeedTableAndId) {
  for (SparseInit init : {SparseInit::kUniform, SparseInit::kNormal}) {
    SparseTableConfig c = Table(2, 16, SparseOptimizer::kSgd);
    c.init = init;
    c.init_scale = 0.5f;
    c.seed = 42;
    SparseTable a(c), b(c);
    SparseTableConfig other = c;
    other.seed = 43;
    SparseTable d(other);
    double sum = 0, sum2 = 0;
    constexpr int kRows = 20000;
    for (int i = 0; i < kRows; ++i) {
      const Key k = SparseKeyOf(i);
      const float* ra = a.FindOrMake(k);
      const float* rb = b.FindOrMake(k);
      for (int j = 0; j < 16; ++j) {
        ASSERT_EQ(ra[j], rb[j]);
        sum += ra[j];
        sum2 += ra[j] * ra[j];
        if (init == SparseInit::kUniform) {
          ASSERT_TRUE(ra[j] >= -0.5f && ra[j] <= 0.5f) << ra[j];
        }
      }
      if (i == 0) {
        EXPECT_NE(ra[0], d.FindOrMake(k)[0]) << "seed ignored";
      }
    }
    const double n = 16.0 * kRows, mean = sum / n;
    const double sd = std::sqrt(sum2 / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 0.01);
    EXPECT_NEAR(sd, init == SparseInit::kNormal ? 0.5 : 0.5 / std::sqrt(3.0),
                0.01);
  }
}

TEST(SparseUnit, AWideTableAllocatesAboutABlockOfBytesNotOfRows) {
  SparseTable t(Table(0, 16384, SparseOptimizer::kAdagrad));
  ASSERT_NE(t.FindOrMake(SparseKeyOf(1)), nullptr);
  // One row of 128 KiB (values and state), in a block of about 1 MiB.
  EXPECT_LE(t.memory_bytes(), 2 * SparseTable::kBlockBytes);
}

TEST(SparseUnit, LoadRefusesANegativeSumOfSquares) {
  for (SparseOptimizer opt :
       {SparseOptimizer::kAdagrad, SparseOptimizer::kFtrl}) {
    SparseTable a(Table(0, 2, opt));
    float* row = a.FindOrMake(SparseKeyOf(5));
    row[a.stride() - 1] = -100.0f;  // Adagrad's h, FTRL's n
    Packer out;
    a.Save(&out);
    SparseTable b(Table(0, 2, opt));
    Unpacker in(out.data());
    Status st = b.Load(&in);
    EXPECT_EQ(st.code(), Status::kCorruption) << st;
    EXPECT_NE(st.message().find("negative sum of squares"), std::string::npos)
        << st;
  }
  // FTRL's z may be negative.
  SparseTable a(Table(0, 2, SparseOptimizer::kFtrl));
  a.FindOrMake(SparseKeyOf(5))[2] = -3.0f;
  Packer out;
  a.Save(&out);
  SparseTable b(Table(0, 2, SparseOptimizer::kFtrl));
  Unpacker in(out.data());
  EXPECT_TRUE(b.Load(&in).ok());
}

// The optimizers of sparse.h, in double, one coordinate at a time.
struct Reference {
  SparseTableConfig c;
  double w = 0, h = 0, z = 0, n = 0;
  void Init(double w0) {
    w = w0;
    h = c.adagrad_init;
    n = 0;
    z = w0 == 0 ? 0
                : -w0 * (c.ftrl_beta / c.ftrl_alpha + c.ftrl_l2) -
                      std::copysign(c.ftrl_l1, w0);
  }
  void Step(double g) {
    switch (c.optimizer) {
      case SparseOptimizer::kSgd:
        w -= c.lr * g;
        break;
      case SparseOptimizer::kAdagrad:
        h += g * g;
        w -= c.lr * g / (std::sqrt(h) + c.adagrad_eps);
        break;
      case SparseOptimizer::kFtrl: {
        const double sigma =
            (std::sqrt(n + g * g) - std::sqrt(n)) / c.ftrl_alpha;
        z += g - sigma * w;
        n += g * g;
        w = std::fabs(z) <= c.ftrl_l1
                ? 0
                : -(z - std::copysign(c.ftrl_l1, z)) /
                      ((c.ftrl_beta + std::sqrt(n)) / c.ftrl_alpha + c.ftrl_l2);
        break;
      }
    }
  }
};

class SparseOptimizerTest : public ::testing::TestWithParam<SparseOptimizer> {};

TEST_P(SparseOptimizerTest, MatchesTheReference) {
  SparseTableConfig c = Table(0, 8, GetParam());
  c.init = SparseInit::kNormal;
  c.init_scale = 0.1f;
  c.seed = 7;
  c.lr = 0.1f;
  c.ftrl_alpha = 0.1f;
  c.ftrl_beta = 1.0f;
  c.ftrl_l1 = 0.5f;
  c.ftrl_l2 = 0.01f;
  SparseTable table(c);
  constexpr int kIds = 50, kSteps = 200;
  std::map<int, std::vector<Reference>> ref;
  std::mt19937 rng(1);
  std::normal_distribution<float> grad(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, kIds - 1);
  for (int step = 0; step < kSteps; ++step) {
    const int id = pick(rng);
    float* row = table.FindOrMake(SparseKeyOf(id));
    auto& r = ref[id];
    if (r.empty()) {
      r.resize(8);
      for (int j = 0; j < 8; ++j) {
        r[j].c = c;
        r[j].Init(row[j]);
      }
    }
    float g[8];
    for (float& x : g) x = grad(rng) * (id % 3 == 0 ? 0.05f : 1.0f);
    table.Apply(row, g);
    for (int j = 0; j < 8; ++j) r[j].Step(g[j]);
  }
  int zeros = 0;
  for (const auto& [id, r] : ref) {
    const float* row = table.Find(SparseKeyOf(id));
    ASSERT_NE(row, nullptr);
    for (int j = 0; j < 8; ++j) {
      EXPECT_NEAR(row[j], r[j].w, 1e-4 * (1 + std::fabs(r[j].w)))
          << "id " << id << " value " << j;
      if (GetParam() == SparseOptimizer::kFtrl &&
          std::fabs(r[j].z) < c.ftrl_l1 * 0.99) {
        EXPECT_EQ(row[j], 0.0f) << "id " << id << " value " << j;
        ++zeros;
      }
    }
  }
  if (GetParam() == SparseOptimizer::kFtrl) {
    EXPECT_GT(zeros, 0) << "l1 kept no weight at exactly zero";
  }
}

INSTANTIATE_TEST_SUITE_P(All, SparseOptimizerTest,
                         ::testing::Values(SparseOptimizer::kSgd,
                                           SparseOptimizer::kAdagrad,
                                           SparseOptimizer::kFtrl));

// ---- Between nodes, over sockets ----------------------------------------

// Servers with a SparseShard each (and, with replicas, a replica shard
// made first); workers with a SparseWorker.
struct SparseJob {
  SparseJob(int s, int w, std::vector<SparseTableConfig> tables,
            int replicas = 0)
      : cluster(s, w,
                [replicas](Config* c) {
                  c->replicas = replicas;
                  c->resend_timeout_ms = 200;
                }),
        tables(std::move(tables)) {}

  bool Start() {
    if (!cluster.Start()) return false;
    const int s = static_cast<int>(cluster.servers.size());
    for (auto& node : cluster.servers) {
      servers.push_back(std::make_unique<KVServer<float>>(node.get(), 0));
      SparseShardOptions o;
      o.num_workers = static_cast<int>(cluster.workers.size());
      o.max_pull_bytes = max_pull_bytes;
      const int rank = node->rank();
      if (node->config().replicas > 0) {
        SparseShardOptions ro = o;
        ro.replica = true;
        replicas.push_back(std::make_unique<SparseShard>(
            servers.back().get(), tables, ro, Snapshot(PrimaryOf(rank, s))));
      }
      shards.push_back(std::make_unique<SparseShard>(
          servers.back().get(), tables, o, Snapshot(rank)));
    }
    for (auto& node : cluster.workers) {
      workers.push_back(std::make_unique<SparseWorker>(node.get(), tables));
    }
    return true;
  }

  SparseSnapshot Snapshot(int rank) {
    return [this, rank](int point, const std::string& state) {
      std::lock_guard<std::mutex> lock(mu);
      snapshots[{rank, point}].push_back(state);
    };
  }

  // The shard holding server `rank`'s own rows.
  SparseShard* ShardOf(int rank) {
    for (size_t i = 0; i < cluster.servers.size(); ++i) {
      if (cluster.servers[i]->rank() == rank) return shards[i].get();
    }
    return nullptr;
  }

  Cluster cluster;
  std::vector<SparseTableConfig> tables;
  int64_t max_pull_bytes = int64_t{1} << 30;
  std::vector<std::unique_ptr<KVServer<float>>> servers;
  std::vector<std::unique_ptr<SparseShard>> replicas, shards;
  std::vector<std::unique_ptr<SparseWorker>> workers;
  std::mutex mu;
  std::map<std::pair<int, int>, std::vector<std::string>> snapshots;
};

TEST(Sparse, RowsComeInTheCallersOrderAndPushesSumExactly) {
  SparseTableConfig sgd = Table(0, 4, SparseOptimizer::kSgd);
  sgd.lr = 0.5f;
  SparseTableConfig uniform = Table(1, 3, SparseOptimizer::kAdagrad);
  uniform.init = SparseInit::kUniform;
  uniform.seed = 9;
  SparseJob job(2, 2, {sgd, uniform});
  ASSERT_TRUE(job.Start());

  // Ids over the whole range, duplicated and unordered.
  const std::vector<uint64_t> ids = {5, 1, 5, 99, 1ull << 40, 1, 77777, 5};
  constexpr int kRounds = 20;
  std::vector<std::thread> threads;
  std::vector<Status> st(2);
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      SparseWorker& kv = *job.workers[w];
      for (int r = 0; r < kRounds && st[w].ok(); ++r) {
        std::vector<float> g(ids.size() * 4);
        for (size_t i = 0; i < g.size(); ++i) g[i] = (w + 1) * ((i % 4) + 1);
        st[w] = kv.Push(0, ids.data(), ids.size(), g.data());
      }
      if (st[w].ok()) st[w] = kv.Sync(1);
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s;

  std::vector<float> rows(ids.size() * 4);
  ASSERT_TRUE(
      job.workers[1]->Pull(0, ids.data(), ids.size(), rows.data()).ok());
  std::map<uint64_t, int> count;
  for (uint64_t id : ids) ++count[id];
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int j = 0; j < 4; ++j) {
      // Each round, worker w pushes (w + 1) (j + 1) per occurrence: in all
      // kRounds * 3 (j + 1) per occurrence, times lr 0.5.
      const float want = -0.5f * kRounds * 3 * (j + 1) * count[ids[i]];
      EXPECT_EQ(rows[i * 4 + j], want) << "id " << ids[i] << " value " << j;
    }
  }

  // Table 1 was never pushed: its rows are the initializer's (not made on
  // the servers), the same on every worker, and the same as a table made
  // here.
  std::vector<float> a(ids.size() * 3), b(ids.size() * 3);
  ASSERT_TRUE(job.workers[0]->Pull(1, ids.data(), ids.size(), a.data()).ok());
  ASSERT_TRUE(job.workers[1]->Pull(1, ids.data(), ids.size(), b.data()).ok());
  EXPECT_EQ(a, b);
  SparseTable local(uniform);
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* row = local.FindOrMake(SparseKeyOf(ids[i]));
    for (int j = 0; j < 3; ++j) EXPECT_EQ(a[i * 3 + j], row[j]);
  }
  // 5 distinct ids pushed over both servers; pulls make no rows.
  EXPECT_EQ(job.ShardOf(0)->rows(0) + job.ShardOf(1)->rows(0), 5u);
  EXPECT_EQ(job.ShardOf(0)->rows(1) + job.ShardOf(1)->rows(1), 0u);
  EXPECT_GT(job.ShardOf(0)->memory_bytes(), 0u);
  EXPECT_TRUE(job.cluster.Finalize());
}

TEST(Sparse, BadRequestsAreRefusedNamingThemAndServingGoesOn) {
  SparseTableConfig t = Table(0, 2, SparseOptimizer::kSgd);
  SparseTableConfig missing = Table(7, 2, SparseOptimizer::kSgd);
  SparseJob job(1, 1, {t});
  job.max_pull_bytes = 64;
  ASSERT_TRUE(job.Start());
  SparseWorker kv(job.cluster.workers[0].get(), {t, missing}, 0, 1);
  const uint64_t ids[] = {1, 2};
  float g[4] = {1, 2, 3, 4};
  Status st = kv.Push(7, ids, 2, g);
  EXPECT_NE(st.message().find("no sparse table 7"), std::string::npos) << st;
  g[3] = std::nanf("");
  st = kv.Push(0, ids, 2, g);
  EXPECT_NE(st.message().find("is not finite"), std::string::npos) << st;
  float rows[4];
  ASSERT_TRUE(kv.Pull(0, ids, 2, rows).ok());
  EXPECT_EQ(std::vector<float>(rows, rows + 4), std::vector<float>(4, 0.0f))
      << "a refused push changed a row";
  g[3] = 4;
  ASSERT_TRUE(kv.Push(0, ids, 2, g).ok());
  ASSERT_TRUE(kv.Pull(0, ids, 2, rows).ok());
  EXPECT_EQ(rows[3], -0.05f * 4);
  // A worker that thinks table 0 is wider: refused both ways, naming both
  // widths, never a crash or rows of the wrong size.
  SparseWorker wide(job.cluster.workers[0].get(),
                    {Table(0, 64, SparseOptimizer::kSgd)}, 0, 2);
  std::vector<float> wide_rows(2 * 64), wide_g(2 * 64, 1.0f);
  st = wide.Pull(0, ids, 2, wide_rows.data());
  EXPECT_NE(st.message().find("are 64 floats wide, this server's 2"),
            std::string::npos)
      << st;
  st = wide.Push(0, ids, 2, wide_g.data());
  EXPECT_NE(st.message().find("are 64 floats wide"), std::string::npos) << st;
  // A pull whose answer would pass max_pull_bytes (64 bytes here: 8 rows).
  std::vector<uint64_t> many(9);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 100 + i;
  std::vector<float> many_rows(many.size() * 2);
  st = kv.Pull(0, many.data(), many.size(), many_rows.data());
  EXPECT_NE(st.message().find("above max_pull_bytes 64"), std::string::npos)
      << st;
  ASSERT_TRUE(kv.Pull(0, many.data(), 8, many_rows.data()).ok());
  EXPECT_EQ(job.shards[0]->bad_requests(), 5);
  EXPECT_TRUE(job.cluster.Finalize());
}

TEST(Sparse, SyncPointsSnapshotEveryServerOnceAndTheStateReloads) {
  SparseTableConfig t = Table(0, 8, SparseOptimizer::kFtrl);
  t.init = SparseInit::kNormal;
  t.ftrl_l1 = 0.1f;
  SparseJob job(2, 2, {t});
  ASSERT_TRUE(job.Start());
  std::vector<std::thread> threads;
  std::vector<Status> st(2);
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(w);
      std::uniform_int_distribution<uint64_t> id(0, 5000);
      for (int point = 1; point <= 3 && st[w].ok(); ++point) {
        for (int b = 0; b < 5 && st[w].ok(); ++b) {
          std::vector<uint64_t> ids(64);
          for (auto& x : ids) x = id(rng);
          std::vector<float> g(ids.size() * 8, 0.25f);
          st[w] = job.workers[w]->Push(0, ids.data(), ids.size(), g.data());
        }
        if (st[w].ok()) st[w] = job.workers[w]->Sync(point);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s;
  std::lock_guard<std::mutex> lock(job.mu);
  for (int rank = 0; rank < 2; ++rank) {
    for (int point = 1; point <= 3; ++point) {
      ASSERT_EQ(job.snapshots[std::make_pair(rank, point)].size(), 1u)
          << "server " << rank << " point " << point;
    }
    // The last snapshot is the shard's state now, and loads into a shard of
    // the same tables.
    const std::string& last = job.snapshots[std::make_pair(rank, 3)][0];
    EXPECT_TRUE(last == job.ShardOf(rank)->Save());
    KVServer<float> spare(job.cluster.servers[0].get(), 1);
    SparseShard fresh(&spare, {t}, SparseShardOptions());
    ASSERT_TRUE(fresh.Load(last).ok());
    EXPECT_TRUE(fresh.Save() == last) << "the state is not canonical";
    EXPECT_EQ(fresh.rows(0), job.ShardOf(rank)->rows(0));
    // Cut short, or for other tables: refused, and nothing changes.
    Status bad = fresh.Load(last.substr(0, last.size() - 5));
    EXPECT_EQ(bad.code(), Status::kCorruption) << bad;
    KVServer<float> spare2(job.cluster.servers[0].get(), 2);
    SparseShard other(&spare2, {Table(0, 4, SparseOptimizer::kFtrl)},
                      SparseShardOptions());
    bad = other.Load(last);
    EXPECT_NE(bad.message().find("expected table 0 of width 4"),
              std::string::npos)
        << bad;
    EXPECT_TRUE(fresh.Save() == last);
  }
  EXPECT_TRUE(job.cluster.Finalize());
}

// PS_REPLICAS=1: server 1 dies mid-run; its replica (server 0) serves its
// rows from then on, and every row ends bit-equal to a table that applied
// the same pushes here, without a fault.
TEST(Sparse, ReplicaTakesOverBitExact) {
  SparseTableConfig t = Table(0, 4, SparseOptimizer::kAdagrad);
  t.init = SparseInit::kNormal;
  t.seed = 3;
  SparseJob job(2, 1, {t}, /*replicas=*/1);
  ASSERT_TRUE(job.Start());
  SparseTable reference(t);
  SparseWorker& kv = *job.workers[0];
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint64_t> pick(0, 2000);
  std::normal_distribution<float> grad(0.0f, 1.0f);
  std::vector<uint64_t> all;
  auto push_batch = [&] {
    std::vector<uint64_t> ids(100);
    for (auto& x : ids) x = pick(rng);
    std::vector<float> g(ids.size() * 4);
    for (auto& x : g) x = grad(rng);
    Status st = kv.Push(0, ids.data(), ids.size(), g.data());
    // The reference: duplicates summed in the caller's order, as the worker
    // sums them, then one step per unique id.
    std::map<Key, std::vector<float>> sum;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto& s = sum[SparseKeyOf(ids[i])];
      s.resize(4, 0.0f);
      for (int j = 0; j < 4; ++j) s[j] += g[i * 4 + j];
    }
    for (auto& [key, s] : sum)
      reference.Apply(reference.FindOrMake(key), s.data());
    all.insert(all.end(), ids.begin(), ids.end());
    return st;
  };
  for (int b = 0; b < 20; ++b) ASSERT_TRUE(push_batch().ok());

  // The replica's rows equal its primary's, bit for bit.
  int victim = -1;
  for (int i = 0; i < 2; ++i) {
    if (job.cluster.servers[i]->rank() == 1) victim = i;
  }
  ASSERT_GE(victim, 0);
  SparseShard* primary = job.shards[victim].get();
  SparseShard* replica = job.replicas[1 - victim].get();
  ASSERT_GT(primary->rows(0), 0u);
  EXPECT_EQ(replica->rows(0), primary->rows(0));
  for (uint64_t id : all) {
    std::vector<float> a, sa, b, sb;
    if (!primary->Row(0, id, &a, &sa)) continue;
    ASSERT_TRUE(replica->Row(0, id, &b, &sb)) << "id " << id;
    EXPECT_EQ(a, b);
    EXPECT_EQ(sa, sb);
  }

  const int dead_id = job.cluster.servers[victim]->id();
  job.cluster.servers[victim]->postoffice()->Abandon();
  for (int b = 0; b < 20; ++b) ASSERT_TRUE(push_batch().ok());
  ASSERT_TRUE(job.cluster.workers[0]->postoffice()->TakenOver(dead_id));

  std::vector<float> rows(all.size() * 4);
  ASSERT_TRUE(kv.Pull(0, all.data(), all.size(), rows.data()).ok());
  for (size_t i = 0; i < all.size(); ++i) {
    const float* want = reference.Find(SparseKeyOf(all[i]));
    ASSERT_NE(want, nullptr);
    for (int j = 0; j < 4; ++j) {
      ASSERT_EQ(rows[i * 4 + j], want[j]) << "id " << all[i];
    }
  }
  job.workers.clear();
  job.shards[victim].reset();
  job.replicas[victim].reset();
}

// PS_REPLICAS=1: the primary dies while a sync point waits for the second
// worker. The first worker is released only once the second reached the
// point too (through the replica), and the replica snapshots the primary's
// rows there, once.
TEST(Sparse, SyncPointSurvivesItsPrimaryDyingMidway) {
  SparseTableConfig t = Table(0, 2, SparseOptimizer::kSgd);
  SparseJob job(2, 2, {t}, /*replicas=*/1);
  ASSERT_TRUE(job.Start());
  const std::vector<uint64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> g(ids.size() * 2, 1.0f);
  for (auto& w : job.workers) {
    ASSERT_TRUE(w->Push(0, ids.data(), ids.size(), g.data()).ok());
  }
  std::atomic<bool> second_reached{false};
  std::atomic<bool> released_early{false};
  Status first;
  std::thread waiter([&] {
    first = job.workers[0]->Sync(1);
    released_early = !second_reached.load();
  });
  int victim = -1;
  for (int i = 0; i < 2; ++i) {
    if (job.cluster.servers[i]->rank() == 1) victim = i;
  }
  ASSERT_GE(victim, 0);
  // Let the first worker's sync point reach both servers (and the copy the
  // replica), then kill the primary of rank 1.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int dead_id = job.cluster.servers[victim]->id();
  job.cluster.servers[victim]->postoffice()->Abandon();
  for (int i = 0;
       i < 100 && !job.cluster.workers[1]->postoffice()->TakenOver(dead_id);
       ++i) {  // at most 10 s
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(job.cluster.workers[1]->postoffice()->TakenOver(dead_id));
  // Time for the first worker to resend its sync point to the replica (its
  // resend timer is 200 ms): it must still wait.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  second_reached = true;
  Status second = job.workers[1]->Sync(1);
  waiter.join();
  ASSERT_TRUE(first.ok()) << first;
  ASSERT_TRUE(second.ok()) << second;
  EXPECT_FALSE(released_early) << "a worker passed the sync point alone";
  SparseShard* replica = job.replicas[1 - victim].get();
  {
    std::lock_guard<std::mutex> lock(job.mu);
    const auto& snaps = job.snapshots[std::make_pair(1, 1)];
    ASSERT_EQ(snaps.size(), 1u) << "rank 1's snapshot at point 1";
    EXPECT_TRUE(snaps[0] == replica->Save());
  }
  std::vector<float> rows(ids.size() * 2);
  ASSERT_TRUE(
      job.workers[1]->Pull(0, ids.data(), ids.size(), rows.data()).ok());
  for (float v : rows) EXPECT_EQ(v, -0.05f * 2);
  job.workers.clear();
  job.shards[victim].reset();
  job.replicas[victim].reset();
}

}  // namespace
}  // namespace ps
