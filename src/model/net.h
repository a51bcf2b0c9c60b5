// Net: the reference MNIST ConvNet (backend.h) over one flat parameter buffer
// and one flat gradient buffer, computed by a CPU or CUDA backend. A
// distributed trainer pushes grads() and pulls into params() by key ranges of
// tensors() without copies.
//
// Thread-safety: not thread-safe; one thread drives a Net. params() and
// grads() stay at the same address for the Net's lifetime.
#ifndef PS_MODEL_NET_H_
#define PS_MODEL_NET_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/dataset.h"
#include "model/tensor_view.h"
#include "ps/status.h"

namespace ps {
namespace model {

// Where a Net keeps params() and grads(): n floats (the default heap
// buffers are 64-byte aligned, ps::SharedArray's are page-aligned) that
// stay valid while the returned pointer lives (e.g. ps::SharedArray's, so
// that co-located servers read the gradients and write the weights in place).
using FloatAllocator = std::function<std::shared_ptr<float>(size_t n)>;

class Net {
 public:
  // Parameters initialised from `seed` as PyTorch initialises Conv2d and
  // Linear (init.h): the same seed gives the same bits on every node. The
  // dropout generator starts from a value derived from `seed` (SeedDropout
  // changes it). Unavailable when `device` cannot be used (backend.h).
  // `alloc` (default: the heap) provides the parameter and gradient buffers.
  static StatusOr<std::unique_ptr<Net>> Create(
      Device device, uint64_t seed, const FloatAllocator& alloc = nullptr);

  float* params() { return params_.get(); }
  const float* params() const { return params_.get(); }
  float* grads() { return grads_.get(); }
  const float* grads() const { return grads_.get(); }
  size_t num_params() const { return num_params_; }
  const std::vector<TensorView>& tensors() const { return ConvNetTensors(); }
  Device device() const { return backend_->device(); }

  // Reinitialises the parameters from `seed` (grads are zeroed).
  void InitParams(uint64_t seed);
  // Restarts the dropout mask generator (e.g. seed + rank, so that workers
  // draw different masks).
  void SeedDropout(uint64_t seed) { dropout_rng_.seed(seed); }
  // The dropout generator's state (std::mt19937_64's text form), e.g. for a
  // checkpoint; SetDropoutState is false for a string that is no such state
  // (the generator is then unchanged).
  std::string DropoutState() const;
  bool SetDropoutState(const std::string& state);

  // Training mode (the default) applies dropout in ForwardBackward; eval mode
  // does not.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  // Label smoothing of ForwardBackward's loss (NllFromLogProbs); 0 by
  // default. Predict and Evaluate are unaffected.
  void set_label_smoothing(float e) { backend_->set_label_smoothing(e); }

  // One forward and backward pass on n images [n, 1, 28, 28] (normalised)
  // with labels [n] in [0, 10). Overwrites grads() with the gradient of the
  // batch's mean NLL loss and returns that loss. `ready`, when set, is called
  // once during the pass as GradsReady (backend.h) says: from then on the
  // caller may read grads() and write params() at and after first_float.
  float ForwardBackward(const float* images, const int32_t* labels, int n,
                        const GradsReady& ready = nullptr);

  // Log-probabilities [n, 10] in eval mode (no dropout).
  void Predict(const float* images, int n, float* log_probs);

 private:
  Net(std::unique_ptr<Backend> backend, const FloatAllocator& alloc);

  std::unique_ptr<Backend> backend_;
  const size_t num_params_;
  std::shared_ptr<float> params_, grads_;
  std::vector<float> mask1_, mask2_;
  std::mt19937_64 dropout_rng_;
  bool training_ = true;
};

struct EvalResult {
  double loss = 0.0;      // mean NLL
  double accuracy = 0.0;  // in [0, 1]
  size_t count = 0;       // examples evaluated
};

// Evaluates the first `limit` examples of `data` (0: all) in batches of
// `batch_size`, without dropout.
EvalResult Evaluate(Net* net, const Dataset& data, int batch_size = 256,
                    size_t limit = 0);

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_NET_H_
