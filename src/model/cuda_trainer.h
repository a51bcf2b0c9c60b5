// The resident trainer on a CUDA GPU (resident_trainer.h): the CUDA
// backend's passes on device parameters and gradients, dropout masks drawn
// by cuRAND, the loss gradient and the optimizer's update as kernels
// (cuda_kernels.h). Batches are staged through two pinned host buffers, so
// the host prepares the next batch while the device computes this one.
// Not thread-safe. Internal header, compiled only with PS_HAVE_CUDA.
#ifndef PS_MODEL_CUDA_TRAINER_H_
#define PS_MODEL_CUDA_TRAINER_H_

#include <cuda_runtime.h>
#include <curand.h>

#include <memory>

#include "model/cuda_backend.h"
#include "model/resident_trainer.h"

namespace ps {
namespace model {

// Unavailable without a CUDA device; InvalidArgument for a bad optimizer.
StatusOr<std::unique_ptr<ResidentTrainer>> MakeCudaTrainer(
    const float* params, const ResidentConfig& config);

class CudaTrainer : public ResidentTrainer {
 public:
  CudaTrainer(const float* params, const ResidentConfig& config);
  ~CudaTrainer() override;
  CudaTrainer(const CudaTrainer&) = delete;
  CudaTrainer& operator=(const CudaTrainer&) = delete;

  void Step(const float* images, const int32_t* labels, int n) override;
  float TakeMeanLoss() override;
  void set_lr(float lr) override { config_.optimizer.lr = lr; }
  void CopyParams(float* params) override;

 private:
  // Pinned host memory for one batch's inputs, and the event that marks
  // their copy to the device done (so the buffer may be refilled).
  struct Staging {
    float* images = nullptr;
    int32_t* labels = nullptr;
    int capacity = 0;  // images
    cudaEvent_t copied = nullptr;
  };
  void Stage(const float* images, const int32_t* labels, int n,
             CudaBackend::Plan* p);
  void DrawMasks(CudaBackend::Plan* p);
  void Update();

  CudaBackend backend_;  // its params_ and grads_ are the model's w and g
  ResidentConfig config_;
  const size_t num_params_;
  gpu::DeviceBuffer state1_, state2_;  // Adam's m and v; SGD's momentum
  gpu::DeviceBuffer labels_;           // int32 labels (4 bytes, as a float)
  gpu::DeviceBuffer loss_sum_;         // 1 float: summed mean losses
  int64_t loss_steps_ = 0;
  int64_t t_ = 0;  // optimizer steps taken
  curandGenerator_t rng_ = nullptr;
  Staging staging_[2];
  int next_staging_ = 0;
};

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_CUDA_TRAINER_H_
