// The CUDA forward and backward pass of the ConvNet (see cuda_backend.h).
#include "model/cuda_backend.h"

#include <glog/logging.h>

#include <vector>

namespace ps {
namespace model {

using gpu::DeviceBuffer;

StatusOr<std::unique_ptr<Backend>> MakeCudaBackend() {
  const Status s = gpu::CudaDeviceStatus();
  if (!s.ok()) {
    return Status::Unavailable("device cuda: no CUDA device: " + s.message());
  }
  std::unique_ptr<Backend> b = std::make_unique<CudaBackend>();
  return b;
}

CudaBackend::CudaBackend()
    : params_(TotalCount(ConvNetTensors())),
      grads_(TotalCount(ConvNetTensors())) {}

CudaBackend::~CudaBackend() = default;

CudaBackend::Plan* CudaBackend::GetPlan(int n) {
  CHECK_GT(n, 0);
  auto& plan = plans_[n];
  if (!plan) plan = std::make_unique<Plan>(&ctx_, n);
  return plan.get();
}

void CudaBackend::RunForward(Plan* p, const float* w, const float* mask1,
                             const float* mask2) {
  const auto& t = ConvNetTensors();
  p->conv1.Forward(p->x.get(), w + t[kConv1Weight].offset,
                   w + t[kConv1Bias].offset, p->c1.get());
  p->relu1.Forward(p->c1.get(), p->a1.get());
  p->conv2.Forward(p->a1.get(), w + t[kConv2Weight].offset,
                   w + t[kConv2Bias].offset, p->c2.get());
  p->pool.Forward(p->c2.get(), p->p.get());  // NCHW: already flat [n, 9216]
  p->fc1_in = p->p.get();
  if (mask1 != nullptr) {
    p->drop1.Forward(p->p.get(), mask1, p->d1.get());
    p->fc1_in = p->d1.get();
  }
  p->fc1.Forward(p->fc1_in, w + t[kFc1Weight].offset, w + t[kFc1Bias].offset,
                 p->h1.get());
  p->relu2.Forward(p->h1.get(), p->r1.get());
  p->fc2_in = p->r1.get();
  if (mask2 != nullptr) {
    p->drop2.Forward(p->r1.get(), mask2, p->d2.get());
    p->fc2_in = p->d2.get();
  }
  p->fc2.Forward(p->fc2_in, w + t[kFc2Weight].offset, w + t[kFc2Bias].offset,
                 p->logits.get());
  p->softmax.Forward(p->logits.get(), p->logp.get());
}

void CudaBackend::RunBackward(Plan* p, const float* w, float* g,
                              const float* mask1, const float* mask2) {
  const auto& t = ConvNetTensors();
  p->fc2.BackwardWeights(p->fc2_in, p->dlogits.get(), g + t[kFc2Weight].offset,
                         g + t[kFc2Bias].offset);
  p->fc2.BackwardData(p->dlogits.get(), w + t[kFc2Weight].offset, p->dd2.get());
  const float* dr1 = p->dd2.get();
  if (mask2 != nullptr) {
    p->drop2.Forward(p->dd2.get(), mask2, p->dr1.get());
    dr1 = p->dr1.get();
  }
  p->relu2.Backward(p->h1.get(), p->r1.get(), dr1, p->dh1.get());
  p->fc1.BackwardWeights(p->fc1_in, p->dh1.get(), g + t[kFc1Weight].offset,
                         g + t[kFc1Bias].offset);
  p->fc1.BackwardData(p->dh1.get(), w + t[kFc1Weight].offset, p->dd1.get());
  const float* dp = p->dd1.get();
  if (mask1 != nullptr) {
    p->drop1.Forward(p->dd1.get(), mask1, p->dp.get());
    dp = p->dp.get();
  }
  p->pool.Backward(p->c2.get(), p->p.get(), dp, p->dc2.get());
  p->conv2.BackwardWeights(p->a1.get(), p->dc2.get(),
                           g + t[kConv2Weight].offset,
                           g + t[kConv2Bias].offset);
  p->conv2.BackwardData(p->dc2.get(), w + t[kConv2Weight].offset, p->da1.get());
  p->relu1.Backward(p->c1.get(), p->a1.get(), p->da1.get(), p->dc1.get());
  p->conv1.BackwardWeights(p->x.get(), p->dc1.get(), g + t[kConv1Weight].offset,
                           g + t[kConv1Bias].offset);
}

float CudaBackend::ForwardBackward(const float* params, float* grads,
                                   const float* images, const int32_t* labels,
                                   int n, const float* mask1,
                                   const float* mask2,
                                   const GradsReady* ready) {
  Plan* p = GetPlan(n);
  params_.Upload(params, params_.size());
  p->x.Upload(images, p->x.size());
  const float* m1 = nullptr;
  const float* m2 = nullptr;
  if (mask1 != nullptr) {
    p->m1.Upload(mask1, p->m1.size());
    m1 = p->m1.get();
  }
  if (mask2 != nullptr) {
    p->m2.Upload(mask2, p->m2.size());
    m2 = p->m2.get();
  }
  RunForward(p, params_.get(), m1, m2);
  // The loss over 10 classes is done on the host.
  std::vector<float> logp(p->logp.size()), dlogits(p->logp.size());
  p->logp.Download(logp.data(), logp.size());
  const float loss = NllFromLogProbs(logp.data(), labels, n, kNumClasses,
                                     dlogits.data(), label_smoothing_);
  p->dlogits.Upload(dlogits.data(), dlogits.size());
  RunBackward(p, params_.get(), grads_.get(), m1, m2);
  grads_.Download(grads, grads_.size());  // synchronises
  // params are on the device from here on, so the host range is free too.
  if (ready != nullptr) (*ready)(ConvNetTensors()[kFc1Weight].offset);
  return loss;
}

void CudaBackend::Forward(const float* params, const float* images, int n,
                          float* log_probs) {
  Plan* p = GetPlan(n);
  params_.Upload(params, params_.size());
  p->x.Upload(images, p->x.size());
  RunForward(p, params_.get(), nullptr, nullptr);
  p->logp.Download(log_probs, p->logp.size());
}

}  // namespace model
}  // namespace ps
