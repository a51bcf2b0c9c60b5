// The few elementwise steps that neither cuDNN nor cuBLAS offer, as CUDA
// kernels (cuda_kernels.cu): the optimizers' updates, dropout masks from
// uniform draws, and the NLL gradient of log-probabilities. Each mirrors a
// CPU function line for line (optimizer.cc, init.cc, backend.cc), so the two
// can be compared; cuda_ops_test does. All pointers are device memory; each
// call is queued on the default stream and returns at once. Internal header,
// compiled only with PS_HAVE_CUDA.
#ifndef PS_MODEL_CUDA_KERNELS_H_
#define PS_MODEL_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace ps {
namespace model {
namespace gpu {

// Adam::Step's loop (optimizer.cc) over n floats: the caller passes the
// step's constants as Adam computes them.
struct AdamConstants {
  float scale, decay, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps, step_size;
};
void AdamStep(float* w, const float* g, float* m, float* v, size_t n,
              const AdamConstants& c);

// Sgd::Step's loop (optimizer.cc); buf may be null when momentum is 0.
struct SgdConstants {
  float scale, decay, lr, momentum;
  bool nesterov, first;
};
void SgdStep(float* w, const float* g, float* buf, size_t n,
             const SgdConstants& c);

// In place: u[i] (uniform in (0, 1], as curandGenerateUniform draws it)
// becomes the dropout multiplier, 0 with probability p, else 1 / (1 - p).
void DropoutMaskFromUniform(float* u, size_t n, float p);

// NllFromLogProbs (backend.h) on the device, with its label smoothing:
// dlogits [n, c] = (exp(log_probs) - target) / n, and the batch's mean loss
// added to *loss_sum (atomically, in no fixed order). labels must be in
// [0, c).
void NllGrad(const float* log_probs, const int32_t* labels, int n, int c,
             float* dlogits, float* loss_sum, float label_smoothing = 0.0f);

}  // namespace gpu
}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_CUDA_KERNELS_H_
