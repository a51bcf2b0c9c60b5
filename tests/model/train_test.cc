// End to end: two epochs of single-process training on the first 6000 MNIST
// training images (Adam, lr 1e-3, batch 32) must reach 93% on the first 2000
// test images. (One epoch lands at 91-93% depending on the seed.)
#include <gtest/gtest.h>

#include <cstdio>

#include "model/dataset.h"
#include "model/net.h"
#include "model/optimizer.h"

namespace ps {
namespace model {
namespace {

constexpr int kBatch = 32;
constexpr float kLr = 1e-3f;

TEST(TrainTest, TwoEpochsOn6000ImagesReach93Percent) {
  auto train = LoadSplit(PS_MNIST_DIR, true, 6000);
  ASSERT_TRUE(train.ok()) << train.status() << "\nrun scripts/fetch_mnist.sh "
                          << PS_MNIST_DIR;
  auto test = LoadSplit(PS_MNIST_DIR, false, 2000);
  ASSERT_TRUE(test.ok()) << test.status();
  auto net_or = Net::Create(Device::kCpu, 1);
  ASSERT_TRUE(net_or.ok()) << net_or.status();
  Net& net = **net_or;
  Adam adam(net.num_params(), kLr);
  Batcher batcher(&*train, kBatch, 1);
  Batch batch;
  int steps = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    batcher.StartEpoch(epoch);
    while (batcher.Next(&batch)) {
      net.ForwardBackward(batch.images.data(), batch.labels.data(), batch.size);
      adam.Step(net.params(), net.grads(), net.num_params());
      ++steps;
    }
  }
  EXPECT_EQ(steps, 2 * ((6000 + kBatch - 1) / kBatch));
  const EvalResult r = Evaluate(&net, *test);
  EXPECT_EQ(r.count, 2000u);
  EXPECT_GE(r.accuracy, 0.93) << "test loss " << r.loss;
  std::printf("test accuracy %.2f%% after %d steps\n", 100 * r.accuracy, steps);
}

}  // namespace
}  // namespace model
}  // namespace ps
