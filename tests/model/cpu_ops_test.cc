// Each CPU layer's backward pass against central finite differences of
// L = sum(y * r) for a fixed random r, on small shapes, in float.
#include "model/cpu_ops.h"

#include <gtest/gtest.h>

#include <numeric>

#include "grad_check.h"
#include "model/backend.h"

namespace ps {
namespace model {
namespace {

using cpu::memory;
using cpu::PlainDesc;
using testing::ExpectGradientMatches;
using testing::RandomVector;

class CpuOpsTest : public ::testing::Test {
 protected:
  memory Plain(const memory::dims& dims, std::vector<float>* v) {
    return memory(PlainDesc(dims), ctx_.engine, v->data());
  }
  // A plain copy of m.
  std::vector<float> ToPlain(const memory& m) {
    const memory::dims dims = m.get_desc().dims();
    const size_t n = std::accumulate(dims.begin(), dims.end(), size_t{1},
                                     std::multiplies<size_t>());
    std::vector<float> out(n);
    cpu::Reorder(&ctx_, m, Plain(dims, &out));
    return out;
  }
  // m (any layout) filled from a plain vector.
  memory FromPlain(std::vector<float> v, const memory::desc& md) {
    memory m(md, ctx_.engine);
    cpu::Reorder(&ctx_, Plain(md.dims(), &v), m);
    return m;
  }
  static double Dot(const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += double{a[i]} * b[i];
    return s;
  }
  cpu::DnnlContext ctx_;
};

struct ConvCase {
  int n, ic, hw, oc;
};

class ConvGradTest : public CpuOpsTest,
                     public ::testing::WithParamInterface<ConvCase> {};

TEST_P(ConvGradTest, BackwardMatchesFiniteDifferences) {
  const ConvCase c = GetParam();
  const int k = 3, out_hw = c.hw - k + 1;
  const memory::dims x_dims{c.n, c.ic, c.hw, c.hw};
  const memory::dims y_dims{c.n, c.oc, out_hw, out_hw};
  std::vector<float> x = RandomVector(c.n * c.ic * c.hw * c.hw, 1);
  std::vector<float> w = RandomVector(c.oc * c.ic * k * k, 2);
  std::vector<float> b = RandomVector(c.oc, 3);
  const std::vector<float> r = RandomVector(c.n * c.oc * out_hw * out_hw, 4);
  cpu::Conv2dOp conv(&ctx_, PlainDesc(x_dims), c.oc, k);
  memory y(conv.dst_desc(), ctx_.engine);
  auto loss = [&] {
    conv.Forward(Plain(x_dims, &x), w.data(), b.data(), y);
    return Dot(ToPlain(y), r);
  };
  loss();
  std::vector<float> dx(x.size()), dw(w.size()), db(b.size());
  memory dy = FromPlain(r, conv.dst_desc());
  conv.BackwardData(dy, w.data(), Plain(x_dims, &dx));
  conv.BackwardWeights(Plain(x_dims, &x), dy, dw.data(), db.data());
  ExpectGradientMatches("dx", &x, dx, loss, 1e-2f, 5e-3, 1e-2, 7);
  ExpectGradientMatches("dw", &w, dw, loss, 1e-2f, 5e-3, 1e-2, 5);
  ExpectGradientMatches("db", &b, db, loss, 1e-2f, 5e-3, 1e-2);
}

// The first case has the network's conv1 shape class (one input channel);
// the second makes oneDNN pick blocked layouts, as for conv2.
INSTANTIATE_TEST_SUITE_P(Shapes, ConvGradTest,
                         ::testing::Values(ConvCase{2, 1, 7, 8},
                                           ConvCase{2, 16, 6, 32}));

TEST_F(CpuOpsTest, ReluBackwardMatchesFiniteDifferences) {
  const memory::dims dims{2, 3, 4, 4};
  std::vector<float> x = RandomVector(96, 5);
  for (auto& v : x) {
    if (std::fabs(v) < 0.01f) v = 0.5f;  // keep away from the kink
  }
  const std::vector<float> r = RandomVector(96, 6);
  std::vector<float> y(96), dx(96), dy = r;
  cpu::ReluOp relu(&ctx_, PlainDesc(dims));
  auto loss = [&] {
    relu.Forward(Plain(dims, &x), Plain(dims, &y));
    return Dot(y, r);
  };
  relu.Backward(Plain(dims, &x), Plain(dims, &dy), Plain(dims, &dx));
  ExpectGradientMatches("dx", &x, dx, loss, 1e-3f, 1e-3, 1e-3);
}

TEST_F(CpuOpsTest, MaxPoolBackwardMatchesFiniteDifferences) {
  const memory::dims dims{2, 16, 6, 6};
  const size_t n = 2 * 16 * 6 * 6;
  // Distinct values 0.01 apart, so a perturbation of 1e-3 never moves a max.
  std::vector<float> x(n);
  std::iota(x.begin(), x.end(), 0.0f);
  std::mt19937_64 rng(7);
  for (size_t i = n; i > 1; --i) std::swap(x[i - 1], x[rng() % i]);
  for (auto& v : x) v = v * 0.01f - 5.0f;
  const std::vector<float> r = RandomVector(n / 4, 8);
  cpu::MaxPoolOp pool(&ctx_, PlainDesc(dims), 2);
  memory y(pool.dst_desc(), ctx_.engine);
  auto loss = [&] {
    pool.Forward(Plain(dims, &x), y);
    return Dot(ToPlain(y), r);
  };
  loss();
  std::vector<float> dx(n);
  pool.Backward(FromPlain(r, pool.dst_desc()), Plain(dims, &dx));
  EXPECT_EQ(std::count(dx.begin(), dx.end(), 0.0f),
            static_cast<long>(n * 3 / 4));
  ExpectGradientMatches("dx", &x, dx, loss, 1e-3f, 1e-3, 1e-3);
}

TEST_F(CpuOpsTest, LinearBackwardMatchesFiniteDifferences) {
  const int n = 3, in = 20, out = 7;
  std::vector<float> x = RandomVector(n * in, 9),
                     w = RandomVector(out * in, 10), b = RandomVector(out, 11);
  const std::vector<float> r = RandomVector(n * out, 12);
  std::vector<float> y(n * out), dx(x.size()), dw(w.size()), db(b.size());
  cpu::LinearOp fc(&ctx_, n, in, out);
  auto loss = [&] {
    fc.Forward(x.data(), w.data(), b.data(), y.data());
    return Dot(y, r);
  };
  fc.BackwardData(r.data(), w.data(), dx.data());
  fc.BackwardWeights(x.data(), r.data(), dw.data(), db.data());
  ExpectGradientMatches("dx", &x, dx, loss, 1e-2f, 2e-3, 1e-3);
  ExpectGradientMatches("dw", &w, dw, loss, 1e-2f, 2e-3, 1e-3);
  ExpectGradientMatches("db", &b, db, loss, 1e-2f, 2e-3, 1e-3);
}

TEST(LossTest, LogSoftmaxNllValuesAndGradient) {
  std::vector<float> z = {1.0f, 2.0f, 3.0f, 0.5f, 0.5f, 0.5f};
  const int32_t labels[2] = {2, 0};
  std::vector<float> lp(6), dz(6);
  const float loss =
      LogSoftmaxNll(z.data(), labels, 2, 3, lp.data(), dz.data());
  // Row 0: log(e^1 + e^2 + e^3) = 3.40760596; row 1: log 3.
  EXPECT_NEAR(lp[2], 3.0 - 3.40760596, 1e-6);
  EXPECT_NEAR(lp[3], -std::log(3.0), 1e-6);
  EXPECT_NEAR(loss, ((3.40760596 - 3.0) + std::log(3.0)) / 2, 1e-6);
  std::vector<float> scratch(6);
  auto f = [&] {
    return double{
        LogSoftmaxNll(z.data(), labels, 2, 3, scratch.data(), nullptr)};
  };
  testing::ExpectGradientMatches("dz", &z, dz, f, 1e-2f, 1e-4, 1e-2);
}

// Label smoothing e: the cross-entropy against (1 - e) one-hot + e / c,
// computed here from the log-probabilities, and its gradient.
TEST(LossTest, LabelSmoothingValuesAndGradient) {
  std::vector<float> z = {1.0f, 2.0f, 3.0f, 0.5f, -1.0f, 0.25f};
  const int32_t labels[2] = {2, 0};
  const float e = 0.1f;
  std::vector<float> lp(6), dz(6);
  const float loss =
      LogSoftmaxNll(z.data(), labels, 2, 3, lp.data(), dz.data(), e);
  double want = 0.0;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      const double target = (j == labels[i] ? 1.0 - e : 0.0) + e / 3;
      want -= target * lp[i * 3 + j];
    }
  }
  EXPECT_NEAR(loss, want / 2, 1e-6);
  // Smoothing moves the gradient off the one-hot: row 0's first class
  // (not the label) gets p - e / 3 over n.
  EXPECT_NEAR(dz[0], (std::exp(lp[0]) - e / 3) / 2, 1e-7);
  std::vector<float> scratch(6);
  auto f = [&] {
    return double{
        LogSoftmaxNll(z.data(), labels, 2, 3, scratch.data(), nullptr, e)};
  };
  testing::ExpectGradientMatches("dz", &z, dz, f, 1e-2f, 1e-4, 1e-2);
}

}  // namespace
}  // namespace model
}  // namespace ps
