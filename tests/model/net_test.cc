// The whole network: parameter count and layout, seeded initialisation, its
// gradient against finite differences, and the loss falling on a batch.
#include "model/net.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "grad_check.h"
#include "model/init.h"
#include "model/optimizer.h"

namespace ps {
namespace model {
namespace {

std::unique_ptr<Net> MakeNet(uint64_t seed) {
  auto net = Net::Create(Device::kCpu, seed);
  CHECK(net.ok()) << net.status();
  return std::move(*net);
}

TEST(NetTest, ParameterCountAndLayout) {
  auto net = MakeNet(1);
  EXPECT_EQ(net->num_params(), 1199882u);
  const auto& t = net->tensors();
  ASSERT_EQ(t.size(), static_cast<size_t>(kNumConvNetTensors));
  EXPECT_EQ(t[kConv1Weight].name, "conv1.weight");
  EXPECT_EQ(t[kFc1Weight].shape, (std::vector<int64_t>{128, 9216}));
  EXPECT_EQ(t[kFc1Weight].count, 1179648u);
  size_t offset = 0;
  for (const auto& v : t) {
    EXPECT_EQ(v.offset, offset) << v.name;
    offset += v.count;
  }
  EXPECT_EQ(t.back().name, "fc2.bias");
  EXPECT_EQ(offset, net->num_params());
}

TEST(NetTest, InitIsDeterministicBySeedAndBounded) {
  auto a = MakeNet(42), b = MakeNet(42), c = MakeNet(43);
  const size_t bytes = a->num_params() * sizeof(float);
  EXPECT_EQ(std::memcmp(a->params(), b->params(), bytes), 0);
  EXPECT_NE(std::memcmp(a->params(), c->params(), bytes), 0);
  for (const auto& v : a->tensors()) {
    // fan_in: 9 for conv1, 288 for conv2, 9216 for fc1, 128 for fc2.
    const int64_t fan_in = v.name.rfind("conv1", 0) == 0   ? 9
                           : v.name.rfind("conv2", 0) == 0 ? 288
                           : v.name.rfind("fc1", 0) == 0   ? 9216
                                                           : 128;
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    float max_abs = 0;
    double sum = 0;
    for (size_t i = 0; i < v.count; ++i) {
      max_abs = std::max(max_abs, std::fabs(a->params()[v.offset + i]));
      sum += a->params()[v.offset + i];
    }
    EXPECT_LE(max_abs, bound) << v.name;
    if (v.count >= 100) {  // enough draws to come near the bound
      EXPECT_GT(max_abs, 0.9f * bound) << v.name;
      EXPECT_LT(std::fabs(sum / v.count), 0.2 * bound) << v.name;
    }
  }
  // Golden first value: mt19937_64(42)'s first draw mapped to U(-1/3, 1/3).
  std::mt19937_64 rng(42);
  EXPECT_EQ(a->params()[0], UniformFloat(&rng, -1.0f / 3, 1.0f / 3));
}

TEST(NetTest, GradientMatchesFiniteDifferencesInEvalMode) {
  auto net = MakeNet(3);
  net->set_training(false);
  const int n = 2;
  const std::vector<float> images =
      testing::RandomVector(n * 784, 5, -0.5f, 2.5f);
  const int32_t labels[n] = {3, 8};
  net->ForwardBackward(images.data(), labels, n);
  const std::vector<float> grads(net->grads(),
                                 net->grads() + net->num_params());
  std::vector<float> params(net->params(), net->params() + net->num_params());
  auto loss = [&] {
    std::copy(params.begin(), params.end(), net->params());
    return double{net->ForwardBackward(images.data(), labels, n)};
  };
  for (const auto& v : net->tensors()) {
    std::vector<float> p(params.begin() + v.offset,
                         params.begin() + v.offset + v.count);
    const std::vector<float> g(grads.begin() + v.offset,
                               grads.begin() + v.offset + v.count);
    auto tensor_loss = [&] {
      std::copy(p.begin(), p.end(), params.begin() + v.offset);
      return loss();
    };
    // The loss is a float: at eps 1e-3 its rounding alone moves a central
    // difference by up to about 4e-4 (seen with oneDNN's AVX2 kernels), so
    // the absolute tolerance is the op tests' 1e-3.
    testing::ExpectGradientMatches(v.name, &p, g, tensor_loss, 1e-3f, 1e-3,
                                   5e-2, v.count / 5 + 1);
  }
}

TEST(NetTest, TrainingIsDeterministicAndDropoutDiffersFromEval) {
  auto a = MakeNet(5), b = MakeNet(5);
  const std::vector<float> images = testing::RandomVector(4 * 784, 6);
  const int32_t labels[4] = {0, 1, 2, 3};
  const float la = a->ForwardBackward(images.data(), labels, 4);
  EXPECT_EQ(la, b->ForwardBackward(images.data(), labels, 4));
  EXPECT_EQ(std::memcmp(a->grads(), b->grads(), a->num_params() * 4), 0);
  a->set_training(false);
  EXPECT_NE(la, a->ForwardBackward(images.data(), labels, 4));
}

// The hook fires once, mid-pass, when the fc grads are final; params from
// there on may be overwritten without changing any gradient.
TEST(NetTest, GradsReadyHookSeesFinalFcGradsAndFreesTheirParams) {
  const int n = 4;
  const std::vector<float> warm = testing::RandomVector(n * 784, 7);
  const std::vector<float> images = testing::RandomVector(n * 784, 8);
  const int32_t labels[n] = {4, 5, 6, 7};
  auto ref = MakeNet(9), net = MakeNet(9);
  ref->ForwardBackward(images.data(), labels, n);
  // A different batch first, so stale grads would differ from the final ones.
  net->ForwardBackward(warm.data(), labels, n);
  net->SeedDropout(0);
  ref->SeedDropout(0);
  ref->ForwardBackward(images.data(), labels, n);

  const size_t fc1 = net->tensors()[kFc1Weight].offset;
  const size_t total = net->num_params();
  int calls = 0;
  size_t first = 0;
  std::vector<float> seen;
  net->ForwardBackward(images.data(), labels, n, [&](size_t first_float) {
    ++calls;
    first = first_float;
    seen.assign(net->grads() + first_float, net->grads() + total);
    // Free to overwrite: must not change any gradient of this pass.
    std::fill(net->params() + first_float, net->params() + total, 1e6f);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(first, fc1);
  ASSERT_EQ(seen.size(), total - fc1);
  EXPECT_EQ(
      std::memcmp(seen.data(), ref->grads() + fc1, seen.size() * sizeof(float)),
      0);
  EXPECT_EQ(std::memcmp(net->grads(), ref->grads(), total * sizeof(float)), 0);
}

TEST(NetTest, LossFallsOnAFixedBatch) {
  auto data = LoadSplit(PS_MNIST_DIR, true, 64);
  ASSERT_TRUE(data.ok()) << data.status() << "\nrun scripts/fetch_mnist.sh "
                         << PS_MNIST_DIR;
  auto net = MakeNet(1);
  Adam adam(net->num_params(), 1e-3f);
  const float first =
      net->ForwardBackward(data->images.data(), data->labels.data(), 64);
  float last = first;
  for (int step = 0; step < 30; ++step) {
    adam.Step(net->params(), net->grads(), net->num_params());
    last = net->ForwardBackward(data->images.data(), data->labels.data(), 64);
  }
  EXPECT_GT(first, 2.0f);  // about log(10) at initialisation
  EXPECT_LT(last, 0.2f * first);
  net->set_training(false);
  const EvalResult r = Evaluate(net.get(), *data, 32);
  EXPECT_EQ(r.count, 64u);
  EXPECT_GE(r.accuracy, 0.95);
}

// Without a CUDA build, or without a device, asking for cuda is a clear
// error; with a device, cuda_ops_test covers the backend.
TEST(NetTest, CudaRequestFailsClearlyWithoutADevice) {
  auto net = Net::Create(Device::kCuda, 1);
#ifdef PS_HAVE_CUDA
  if (net.ok())
    GTEST_SKIP() << "a CUDA device is present: cuda_ops_test covers it";
#endif
  ASSERT_FALSE(net.ok());
  EXPECT_EQ(net.status().code(), Status::kUnavailable);
  EXPECT_EQ(net.status().message().rfind("device cuda: ", 0), 0u)
      << net.status();
}

TEST(NetTest, DeviceNames) {
  EXPECT_EQ(*ParseDevice("cpu"), Device::kCpu);
  EXPECT_EQ(*ParseDevice("cuda"), Device::kCuda);
  EXPECT_NE(ParseDevice("tpu").status().message().find("'tpu'"),
            std::string::npos);
}

}  // namespace
}  // namespace model
}  // namespace ps
