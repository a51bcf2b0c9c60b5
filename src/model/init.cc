// Seeded initialisation and dropout masks (see init.h).
#include "model/init.h"

#include <glog/logging.h>

#include <cmath>

namespace ps {
namespace model {

std::vector<TensorView> LayOut(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& specs) {
  std::vector<TensorView> views;
  size_t offset = 0;
  for (const auto& [name, shape] : specs) {
    size_t count = 1;
    for (int64_t d : shape) {
      CHECK_GT(d, 0) << name;
      count *= static_cast<size_t>(d);
    }
    views.push_back(TensorView{name, shape, offset, count});
    offset += count;
  }
  return views;
}

size_t TotalCount(const std::vector<TensorView>& views) {
  size_t n = 0;
  for (const auto& v : views) n += v.count;
  return n;
}

float UniformFloat(std::mt19937_64* rng, float lo, float hi) {
  // 24 bits fill a float's mantissa exactly, so u is exact and in [0, 1).
  const float u = static_cast<float>((*rng)() >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

void InitParams(const std::vector<TensorView>& views, uint64_t seed,
                float* params) {
  std::mt19937_64 rng(seed);
  size_t fan_in = 0;
  for (const auto& v : views) {
    const bool is_bias = v.name.size() >= 5 &&
                         v.name.compare(v.name.size() - 5, 5, ".bias") == 0;
    if (!is_bias) {
      fan_in = v.count / static_cast<size_t>(v.shape[0]);
    }
    CHECK_GT(fan_in, 0u) << "bias " << v.name << " has no weight before it";
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    for (size_t i = 0; i < v.count; ++i) {
      params[v.offset + i] = UniformFloat(&rng, -bound, bound);
    }
  }
}

void FillDropoutMask(std::mt19937_64* rng, float p, float* mask, size_t n) {
  CHECK(p >= 0.0f && p < 1.0f) << "dropout probability " << p;
  const float scale = 1.0f / (1.0f - p);
  for (size_t i = 0; i < n; ++i) {
    mask[i] = UniformFloat(rng, 0.0f, 1.0f) < p ? 0.0f : scale;
  }
}

}  // namespace model
}  // namespace ps
