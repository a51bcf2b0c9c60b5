// Deterministic random numbers for the model: parameter initialisation and
// dropout masks. Built on std::mt19937_64 (whose output sequence the standard
// fixes) with our own mapping to floats, so that the same seed gives the same
// bits on every node, compiler and standard library.
#ifndef PS_MODEL_INIT_H_
#define PS_MODEL_INIT_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "model/tensor_view.h"

namespace ps {
namespace model {

// A uniform float in [lo, hi) from the top 24 bits of one draw.
float UniformFloat(std::mt19937_64* rng, float lo, float hi);

// PyTorch's default initialisation for Conv2d and Linear: weights by
// kaiming_uniform_(a = sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and
// biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), where fan_in is the product of a
// weight's shape without its first dimension. A tensor whose name ends in
// ".bias" takes fan_in from the tensor just before it (its weight). Fills
// params[view.offset ...] for every view, in order, from one generator.
void InitParams(const std::vector<TensorView>& views, uint64_t seed,
                float* params);

// mask[i] = 0 with probability p, else 1 / (1 - p) (inverted dropout, as
// torch.nn.Dropout in training mode). 0 <= p < 1.
void FillDropoutMask(std::mt19937_64* rng, float p, float* mask, size_t n);

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_INIT_H_
