// Batcher: deterministic shuffling by seed and disjoint shards per worker.
#include "model/dataset.h"

#include <gtest/gtest.h>

#include <set>

namespace ps {
namespace model {
namespace {

// A dataset of n 1x1 "images" whose pixel is the example's index.
Dataset Indexed(size_t n) {
  Dataset d;
  d.size = n;
  d.rows = d.cols = 1;
  for (size_t i = 0; i < n; ++i) {
    d.images.push_back(static_cast<float>(i));
    d.labels.push_back(static_cast<int32_t>(i % 10));
  }
  return d;
}

std::vector<int> Epoch(Batcher* b, int epoch) {
  b->StartEpoch(epoch);
  std::vector<int> seen;
  Batch batch;
  while (b->Next(&batch)) {
    for (int i = 0; i < batch.size; ++i) {
      seen.push_back(static_cast<int>(batch.images[i]));
      EXPECT_EQ(batch.labels[i], seen.back() % 10);
    }
  }
  return seen;
}

TEST(BatcherTest, ShuffleIsDeterministicBySeedAndEpoch) {
  const Dataset d = Indexed(100);
  Batcher a(&d, 32, 7), b(&d, 32, 7), c(&d, 32, 8);
  EXPECT_EQ(a.batches_per_epoch(), 4);  // 32, 32, 32, 4
  const auto a0 = Epoch(&a, 0);
  EXPECT_EQ(a0, Epoch(&b, 0));
  EXPECT_NE(a0, Epoch(&c, 0));
  EXPECT_NE(a0, Epoch(&a, 1));
  EXPECT_EQ(std::set<int>(a0.begin(), a0.end()).size(), 100u);
  Batcher plain(&d, 50, 7, 0, 1, false);
  const auto p = Epoch(&plain, 3);
  EXPECT_EQ(p.front(), 0);
  EXPECT_EQ(p.back(), 99);
}

TEST(BatcherTest, ShardsAreDisjointAndEqual) {
  const Dataset d = Indexed(103);
  const int workers = 4;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int> all;
    for (int r = 0; r < workers; ++r) {
      Batcher b(&d, 10, 99, r, workers);
      EXPECT_EQ(b.shard_size(), 25u);
      for (int i : Epoch(&b, epoch)) EXPECT_TRUE(all.insert(i).second) << i;
    }
    EXPECT_EQ(all.size(), 100u);  // 103 mod 4 = 3 examples sit out
  }
}

TEST(DatasetTest, ParseNames) {
  EXPECT_EQ(*ParseDatasetKind("fashion"), DatasetKind::kFashion);
  EXPECT_EQ(*ParseDatasetKind("mnist"), DatasetKind::kMnist);
  auto bad = ParseDatasetKind("cifar");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'cifar'"), std::string::npos);
}

TEST(DatasetTest, MissingFolderSaysHowToFetch) {
  auto d = LoadSplit("/nonexistent/mnist", true);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Status::kNotFound);
  EXPECT_NE(
      d.status().message().find("/nonexistent/mnist/train-images-idx3-ubyte"),
      std::string::npos);
  EXPECT_NE(d.status().message().find("scripts/fetch_mnist.sh"),
            std::string::npos);
}

}  // namespace
}  // namespace model
}  // namespace ps
