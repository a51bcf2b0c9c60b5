// Training with everything on the GPU (see cuda_trainer.h).
#include "model/cuda_trainer.h"

#include <glog/logging.h>

#include <cmath>
#include <cstring>

#include "model/cuda_kernels.h"

#define PS_CUDA_CHECK(expr)                                            \
  do {                                                                 \
    const cudaError_t e_ = (expr);                                     \
    CHECK_EQ(e_, cudaSuccess) << #expr ": " << cudaGetErrorString(e_); \
  } while (0)
#define PS_CURAND_CHECK(expr)                                     \
  do {                                                            \
    const curandStatus_t s_ = (expr);                             \
    CHECK_EQ(s_, CURAND_STATUS_SUCCESS) << #expr ": " << int{s_}; \
  } while (0)

namespace ps {
namespace model {

StatusOr<std::unique_ptr<ResidentTrainer>> MakeCudaTrainer(
    const float* params, const ResidentConfig& config) {
  const Status device = gpu::CudaDeviceStatus();
  if (!device.ok()) {
    return Status::Unavailable("device cuda: no CUDA device: " +
                               device.message());
  }
  // The optimizer's own checks name a bad field; its state is not used.
  StatusOr<std::unique_ptr<Optimizer>> check =
      MakeOptimizer(config.optimizer, 1);
  if (!check.ok()) return check.status();
  std::unique_ptr<ResidentTrainer> t =
      std::make_unique<CudaTrainer>(params, config);
  return t;
}

CudaTrainer::CudaTrainer(const float* params, const ResidentConfig& config)
    : config_(config), num_params_(TotalCount(ConvNetTensors())), loss_sum_(1) {
  backend_.params_.Upload(params, num_params_);
  const bool adam = config_.optimizer.name == "adam";
  if (adam || config_.optimizer.momentum != 0.0f) {
    state1_ = gpu::DeviceBuffer(num_params_);
  }
  if (adam) state2_ = gpu::DeviceBuffer(num_params_);
  PS_CURAND_CHECK(
      curandCreateGenerator(&rng_, CURAND_RNG_PSEUDO_PHILOX4_32_10));
  PS_CURAND_CHECK(
      curandSetPseudoRandomGeneratorSeed(rng_, config_.dropout_seed));
  for (Staging& s : staging_) {
    PS_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
  }
}

CudaTrainer::~CudaTrainer() {
  cudaDeviceSynchronize();  // no copy may still read the staging buffers
  for (Staging& s : staging_) {
    cudaFreeHost(s.images);
    cudaFreeHost(s.labels);
    cudaEventDestroy(s.copied);
  }
  curandDestroyGenerator(rng_);
}

void CudaTrainer::Step(const float* images, const int32_t* labels, int n) {
  CHECK_GT(n, 0);
  for (int i = 0; i < n; ++i) {
    CHECK(labels[i] >= 0 && labels[i] < kNumClasses) << "label " << labels[i];
  }
  CudaBackend::Plan* p = backend_.GetPlan(n);
  Stage(images, labels, n, p);
  const float* m1 = nullptr;
  const float* m2 = nullptr;
  if (config_.dropout) {
    DrawMasks(p);
    m1 = p->m1.get();
    m2 = p->m2.get();
  }
  float* w = backend_.params_.get();
  float* g = backend_.grads_.get();
  backend_.RunForward(p, w, m1, m2);
  gpu::NllGrad(p->logp.get(), reinterpret_cast<const int32_t*>(labels_.get()),
               n, kNumClasses, p->dlogits.get(), loss_sum_.get(),
               config_.label_smoothing);
  backend_.RunBackward(p, w, g, m1, m2);
  Update();
  ++loss_steps_;
}

// Copies the batch into the staging buffer the device is done with, and
// queues its copy to the device behind the previous step.
void CudaTrainer::Stage(const float* images, const int32_t* labels, int n,
                        CudaBackend::Plan* p) {
  Staging& s = staging_[next_staging_];
  next_staging_ ^= 1;
  PS_CUDA_CHECK(cudaEventSynchronize(s.copied));
  const size_t image_floats = p->x.size();  // n * 784
  if (s.capacity < n) {
    cudaFreeHost(s.images);
    cudaFreeHost(s.labels);
    void* host = nullptr;
    PS_CUDA_CHECK(cudaMallocHost(&host, image_floats * sizeof(float)));
    s.images = static_cast<float*>(host);
    PS_CUDA_CHECK(cudaMallocHost(&host, n * sizeof(int32_t)));
    s.labels = static_cast<int32_t*>(host);
    s.capacity = n;
  }
  if (labels_.size() < static_cast<size_t>(n)) {
    labels_ = gpu::DeviceBuffer(n);
  }
  std::memcpy(s.images, images, image_floats * sizeof(float));
  std::memcpy(s.labels, labels, n * sizeof(int32_t));
  PS_CUDA_CHECK(cudaMemcpyAsync(p->x.get(), s.images,
                                image_floats * sizeof(float),
                                cudaMemcpyHostToDevice, nullptr));
  PS_CUDA_CHECK(cudaMemcpyAsync(labels_.get(), s.labels, n * sizeof(int32_t),
                                cudaMemcpyHostToDevice, nullptr));
  PS_CUDA_CHECK(cudaEventRecord(s.copied, nullptr));
}

void CudaTrainer::DrawMasks(CudaBackend::Plan* p) {
  PS_CURAND_CHECK(curandGenerateUniform(rng_, p->m1.get(), p->m1.size()));
  gpu::DropoutMaskFromUniform(p->m1.get(), p->m1.size(), kDropout1);
  PS_CURAND_CHECK(curandGenerateUniform(rng_, p->m2.get(), p->m2.size()));
  gpu::DropoutMaskFromUniform(p->m2.get(), p->m2.size(), kDropout2);
}

// The optimizer's update with the constants its CPU Step computes.
void CudaTrainer::Update() {
  const OptimizerConfig& c = config_.optimizer;
  float* w = backend_.params_.get();
  const float* g = backend_.grads_.get();
  ++t_;
  if (c.name == "adam") {
    const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), t_);
    const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), t_);
    gpu::AdamConstants k;
    k.scale = 1.0f;
    k.decay = c.weight_decay;
    k.one_minus_b1 = 1.0f - c.beta1;
    k.b2 = c.beta2;
    k.one_minus_b2 = 1.0f - c.beta2;
    k.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    k.eps = c.eps;
    k.step_size = static_cast<float>(c.lr / bc1);
    gpu::AdamStep(w, g, state1_.get(), state2_.get(), num_params_, k);
    return;
  }
  gpu::SgdConstants k;
  k.scale = 1.0f;
  k.decay = c.weight_decay;
  k.lr = c.lr;
  k.momentum = c.momentum;
  k.nesterov = c.nesterov;
  k.first = t_ == 1;
  gpu::SgdStep(w, g, state1_.get(), num_params_, k);
}

float CudaTrainer::TakeMeanLoss() {
  float sum = 0.0f;
  loss_sum_.Download(&sum, 1);  // waits for the queued steps
  PS_CUDA_CHECK(cudaMemset(loss_sum_.get(), 0, sizeof(float)));
  const int64_t steps = loss_steps_;
  loss_steps_ = 0;
  return steps == 0 ? 0.0f : sum / steps;
}

void CudaTrainer::CopyParams(float* params) {
  backend_.params_.Download(params, num_params_);
}

}  // namespace model
}  // namespace ps
