// SGD and Adam steps against torch.optim's formulas worked by hand, and
// slice-wise steps against whole-buffer steps.
#include "model/optimizer.h"

#include <gtest/gtest.h>

#include "grad_check.h"

namespace ps {
namespace model {
namespace {

TEST(SgdTest, MomentumMatchesTorch) {
  // buf1 = g; w1 = w0 - lr g. buf2 = m buf1 + g; w2 = w1 - lr buf2.
  Sgd sgd(2, 0.5f, 0.5f);
  std::vector<float> w = {1.0f, -2.0f};
  const std::vector<float> g = {0.5f, 1.0f};
  sgd.Step(w.data(), g.data(), 2);
  EXPECT_EQ(w, (std::vector<float>{0.75f, -2.5f}));
  sgd.Step(w.data(), g.data(), 2);
  EXPECT_EQ(w, (std::vector<float>{0.375f, -3.25f}));
}

TEST(SgdTest, NesterovMatchesTorch) {
  // d = g + m buf.
  Sgd sgd(2, 0.5f, 0.5f, 0.0f, true);
  std::vector<float> w = {1.0f, -2.0f};
  const std::vector<float> g = {0.5f, 1.0f};
  sgd.Step(w.data(), g.data(), 2);
  EXPECT_EQ(w, (std::vector<float>{0.625f, -2.75f}));
  sgd.Step(w.data(), g.data(), 2);
  EXPECT_EQ(w, (std::vector<float>{0.1875f, -3.625f}));
}

TEST(SgdTest, WeightDecayAddsToGradient) {
  Sgd sgd(1, 0.5f, 0.0f, 0.25f);
  float w = 1.0f;
  const float g = 0.5f;
  sgd.Step(&w, &g, 1);
  EXPECT_EQ(w, 0.625f);  // 1 - 0.5 * (0.5 + 0.25 * 1)
}

TEST(AdamTest, TwoStepsMatchTorch) {
  // lr 0.1, betas (0.5, 0.75), eps 0, g = 2 twice:
  // m1 = 1, v1 = 1, w1 = 1 - (0.1 / 0.5) * 1 / (1 / sqrt(0.25)) = 0.9;
  // m2 = 1.5, v2 = 1.75, w2 = 0.9 - (0.1 / 0.75) * 1.5 / (sqrt(1.75 /
  // 0.4375)) = 0.8.
  Adam adam(1, 0.1f, 0.5f, 0.75f, 0.0f);
  float w = 1.0f;
  const float g = 2.0f;
  adam.Step(&w, &g, 1);
  EXPECT_NEAR(w, 0.9f, 1e-6);
  adam.Step(&w, &g, 1);
  EXPECT_NEAR(w, 0.8f, 1e-6);
}

TEST(AdamTest, WeightDecayAddsToGradient) {
  Adam adam(1, 0.1f, 0.5f, 0.75f, 0.0f, 0.5f);
  float w = 1.0f;
  const float g = 1.5f;  // + 0.5 * 1 = 2, as above
  adam.Step(&w, &g, 1);
  EXPECT_NEAR(w, 0.9f, 1e-6);
}

TEST(AdamTest, DefaultEpsFirstStepIsLrTimesSign) {
  Adam adam(2);
  std::vector<float> w = {0.0f, 0.0f};
  const std::vector<float> g = {3.0f, -0.25f};
  adam.Step(w.data(), g.data(), 2);
  EXPECT_NEAR(w[0], -1e-3f, 1e-9);
  EXPECT_NEAR(w[1], 1e-3f, 1e-9);
}

template <typename MakeOpt>
void ExpectSlicesEqualWhole(MakeOpt make) {
  const size_t n = 1000, cut = 400;
  std::vector<float> whole = testing::RandomVector(n, 1);
  std::vector<float> sliced = whole;
  auto opt = make(n), lo = make(cut), hi = make(n - cut);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = testing::RandomVector(n, 10 + step);
    opt->Step(whole.data(), g.data(), n);
    lo->Step(sliced.data(), g.data(), cut);
    hi->Step(sliced.data() + cut, g.data() + cut, n - cut);
  }
  EXPECT_EQ(whole, sliced);
  EXPECT_NE(whole, testing::RandomVector(n, 1));
}

TEST(OptimizerTest, SliceStepsEqualWholeBufferSteps) {
  ExpectSlicesEqualWhole([](size_t n) {
    return std::make_unique<Sgd>(n, 0.1f, 0.9f, 1e-4f, true);
  });
  ExpectSlicesEqualWhole([](size_t n) {
    return std::make_unique<Adam>(n, 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-4f);
  });
}

TEST(OptimizerTest, MakeOptimizerChecksConfig) {
  OptimizerConfig c;
  c.name = "sgd";
  c.momentum = 0.9f;
  auto sgd = MakeOptimizer(c, 10);
  ASSERT_TRUE(sgd.ok());
  EXPECT_EQ((*sgd)->size(), 10u);
  c.name = "adagrad";
  auto bad = MakeOptimizer(c, 10);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'adagrad'"), std::string::npos);
  c.name = "adam";
  c.lr = -1.0f;
  EXPECT_EQ(MakeOptimizer(c, 10).status().code(), Status::kInvalidArgument);
}

TEST(StepLRTest, DecaysEveryStepSize) {
  StepLR s(1.0f, 2, 0.5f);
  EXPECT_EQ(s.LrAt(0), 1.0f);
  EXPECT_EQ(s.LrAt(1), 1.0f);
  EXPECT_EQ(s.LrAt(2), 0.5f);
  EXPECT_EQ(s.LrAt(5), 0.25f);
}

}  // namespace
}  // namespace model
}  // namespace ps
