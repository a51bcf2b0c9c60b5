// Finite-difference helpers shared by the layer and network gradient tests.
#ifndef PS_TESTS_MODEL_GRAD_CHECK_H_
#define PS_TESTS_MODEL_GRAD_CHECK_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace ps {
namespace model {
namespace testing {

inline std::vector<float> RandomVector(size_t n, uint64_t seed, float lo = -1,
                                       float hi = 1) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = lo + (hi - lo) * static_cast<float>(rng() >> 40) / 16777216.0f;
  }
  return v;
}

// Checks analytic[i] against the central difference of `loss` with respect
// to (*x)[i] for every `stride`-th i (and the last). `loss` reads *x.
inline void ExpectGradientMatches(const std::string& what,
                                  std::vector<float>* x,
                                  const std::vector<float>& analytic,
                                  const std::function<double()>& loss,
                                  float eps, double abs_tol, double rel_tol,
                                  size_t stride = 1) {
  ASSERT_EQ(x->size(), analytic.size()) << what;
  int checked = 0;
  for (size_t i = 0; i < x->size(); i += stride) {
    const float saved = (*x)[i];
    (*x)[i] = saved + eps;
    const double up = loss();
    (*x)[i] = saved - eps;
    const double down = loss();
    (*x)[i] = saved;
    const double numeric = (up - down) / (2.0 * eps);
    EXPECT_NEAR(analytic[i], numeric, abs_tol + rel_tol * std::fabs(numeric))
        << what << "[" << i << "]";
    ++checked;
  }
  EXPECT_GT(checked, 0) << what;
}

}  // namespace testing
}  // namespace model
}  // namespace ps

#endif  // PS_TESTS_MODEL_GRAD_CHECK_H_
