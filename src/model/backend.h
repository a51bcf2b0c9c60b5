// The ConvNet's fixed architecture and the interface every compute backend
// (CPU on oneDNN, CUDA on cuDNN + cuBLAS) implements for it.
//
//   x [n, 1, 28, 28] -> conv1 (1->32, 3x3) -> ReLU -> conv2 (32->64, 3x3)
//   -> max-pool 2x2 -> dropout(0.25) -> flatten [n, 9216] -> fc1 (9216->128)
//   -> ReLU -> dropout(0.5) -> fc2 (128->10) -> log-softmax -> NLL (mean).
#ifndef PS_MODEL_BACKEND_H_
#define PS_MODEL_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/tensor_view.h"
#include "ps/status.h"

namespace ps {
namespace model {

constexpr int kImageSide = 28;
constexpr int kConv1Channels = 32;
constexpr int kConv2Channels = 64;
constexpr int kKernel = 3;
constexpr int kPooledSide = 12;  // (28-4)/2
constexpr int kFlatFeatures =
    kConv2Channels * kPooledSide * kPooledSide;  // 9216
constexpr int kHidden = 128;
constexpr int kNumClasses = 10;
constexpr float kDropout1 = 0.25f;
constexpr float kDropout2 = 0.5f;

// Index of each tensor in ConvNetTensors(), which is also its order in the
// flat buffer.
enum ConvNetTensor {
  kConv1Weight,  // [32, 1, 3, 3]
  kConv1Bias,    // [32]
  kConv2Weight,  // [64, 32, 3, 3]
  kConv2Bias,    // [64]
  kFc1Weight,    // [128, 9216]
  kFc1Bias,      // [128]
  kFc2Weight,    // [10, 128]
  kFc2Bias,      // [10]
  kNumConvNetTensors
};

// The views of the flat parameter buffer, named as PyTorch names them
// ("conv1.weight", ...). 1,199,882 floats in all.
const std::vector<TensorView>& ConvNetTensors();

enum class Device { kCpu, kCuda };

// "cpu" or "cuda"; InvalidArgument naming the value otherwise.
StatusOr<Device> ParseDevice(const std::string& name);
const char* DeviceName(Device device);

// Called once per ForwardBackward, on the calling thread, as soon as
// grads[first_float, num_params) hold their final values and params in that
// range are no longer read by the pass (so a caller may send those gradients
// and overwrite those params while the rest of the backward pass runs; it
// must not touch anything below first_float until ForwardBackward returns).
using GradsReady = std::function<void(size_t first_float)>;

// Computes the network on host buffers. All pointers are host memory; params
// and grads are flat buffers laid out as ConvNetTensors(). A backend caches
// what it builds per batch size. Not thread-safe.
class Backend {
 public:
  virtual ~Backend() = default;

  // Forward and backward on a batch of n images ([n, 1, 28, 28], normalised)
  // with labels in [0, 10). mask1 ([n, 9216]) and mask2 ([n, 128]) are the
  // dropout multipliers (0 or 1/(1-p)), or null for no dropout. Overwrites
  // grads with d(mean NLL)/d(params); returns the mean NLL. `ready`, when
  // not null, is called once as GradsReady says (the CPU backend after fc1's
  // backward pass with first_float = the offset of fc1.weight; the CUDA
  // backend after its copy back, with the same first_float).
  virtual float ForwardBackward(const float* params, float* grads,
                                const float* images, const int32_t* labels,
                                int n, const float* mask1, const float* mask2,
                                const GradsReady* ready) = 0;

  // Inference (no dropout): log_probs [n, 10].
  virtual void Forward(const float* params, const float* images, int n,
                       float* log_probs) = 0;

  virtual Device device() const = 0;

  // Label smoothing of the training loss (NllFromLogProbs); 0 by default.
  void set_label_smoothing(float e) { label_smoothing_ = e; }

 protected:
  float label_smoothing_ = 0.0f;
};

// A backend for `device`. Unavailable naming the device and why when the
// build has no CUDA backend or no CUDA device is present.
StatusOr<std::unique_ptr<Backend>> MakeBackend(Device device);

// Threads the CPU backend uses (OpenMP); n <= 0 keeps the default (all
// cores). Process-wide, as OpenMP's setting is.
void SetCpuThreads(int n);

// Row-wise log-softmax of logits [n, c] into log_probs, the mean NLL of
// labels, and (when dlogits is not null) d(mean NLL)/d(logits) [n, c]; with
// label smoothing as NllFromLogProbs.
float LogSoftmaxNll(const float* logits, const int32_t* labels, int n, int c,
                    float* log_probs, float* dlogits,
                    float label_smoothing = 0.0f);

// The mean NLL of labels under log_probs [n, c], and (when dlogits is not
// null) its gradient with respect to the logits: (exp(log_probs) - target)
// / n. The target is the one-hot label, or with label smoothing e in
// [0, 1) (torch.nn.CrossEntropyLoss's label_smoothing) (1 - e) one-hot +
// e / c, and the loss its cross-entropy: -(1 - e) lp[label] - e mean(lp).
float NllFromLogProbs(const float* log_probs, const int32_t* labels, int n,
                      int c, float* dlogits, float label_smoothing = 0.0f);

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_BACKEND_H_
