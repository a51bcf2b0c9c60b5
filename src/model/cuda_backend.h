// The ConvNet on a CUDA GPU (cuda_ops.h), behind the same Backend interface as
// the CPU: parameters, images and dropout masks are uploaded per call and the
// gradients downloaded into the host's flat buffer. Not thread-safe.
// Internal header, compiled only with PS_HAVE_CUDA.
#ifndef PS_MODEL_CUDA_BACKEND_H_
#define PS_MODEL_CUDA_BACKEND_H_

#include <map>
#include <memory>

#include "model/backend.h"
#include "model/cuda_ops.h"

namespace ps {
namespace model {

// Unavailable ("device cuda: no CUDA device: ...") when none can be used.
StatusOr<std::unique_ptr<Backend>> MakeCudaBackend();

class CudaBackend : public Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;
  float ForwardBackward(const float* params, float* grads, const float* images,
                        const int32_t* labels, int n, const float* mask1,
                        const float* mask2, const GradsReady* ready) override;
  void Forward(const float* params, const float* images, int n,
               float* log_probs) override;
  Device device() const override { return Device::kCuda; }

 private:
  friend class CudaTrainer;  // drives the same passes on its own buffers

  struct Plan;  // the ops and device activations of one batch size
  Plan* GetPlan(int n);
  // The passes on device memory: w and g are flat [num_params] parameters
  // and gradients, the masks [n, 9216] and [n, 128] or null (no dropout).
  // RunForward reads the images from the plan's x and leaves logp;
  // RunBackward reads the plan's dlogits and overwrites g.
  void RunForward(Plan* p, const float* w, const float* mask1,
                  const float* mask2);
  void RunBackward(Plan* p, const float* w, float* g, const float* mask1,
                   const float* mask2);

  gpu::CudaContext ctx_;
  gpu::DeviceBuffer params_, grads_;
  std::map<int, std::unique_ptr<Plan>> plans_;
};

// The ops and device buffers of one batch size (built once, reused).
struct CudaBackend::Plan {
  static constexpr int kConv1Side = kImageSide - kKernel + 1;  // 26
  static constexpr int kConv2Side = kConv1Side - kKernel + 1;  // 24

  Plan(gpu::CudaContext* ctx, int batch)
      : n(batch),
        conv1(ctx, n, 1, kImageSide, kImageSide, kConv1Channels, kKernel),
        relu1(ctx, n, kConv1Channels, kConv1Side, kConv1Side),
        conv2(ctx, n, kConv1Channels, kConv1Side, kConv1Side, kConv2Channels,
              kKernel),
        pool(ctx, n, kConv2Channels, kConv2Side, kConv2Side, 2),
        drop1(ctx, n * kFlatFeatures),
        fc1(ctx, n, kFlatFeatures, kHidden),
        relu2(ctx, n, kHidden, 1, 1),
        drop2(ctx, n * kHidden),
        fc2(ctx, n, kHidden, kNumClasses),
        softmax(ctx, n, kNumClasses) {
    const size_t un = static_cast<size_t>(n);
    const size_t conv1_out = un * kConv1Channels * kConv1Side * kConv1Side;
    const size_t conv2_out = un * kConv2Channels * kConv2Side * kConv2Side;
    x = gpu::DeviceBuffer(un * kImageSide * kImageSide);
    for (gpu::DeviceBuffer* b : {&c1, &a1, &dc1, &da1})
      *b = gpu::DeviceBuffer(conv1_out);
    for (gpu::DeviceBuffer* b : {&c2, &dc2}) *b = gpu::DeviceBuffer(conv2_out);
    for (gpu::DeviceBuffer* b : {&p, &d1, &m1, &dd1, &dp}) {
      *b = gpu::DeviceBuffer(un * kFlatFeatures);
    }
    for (gpu::DeviceBuffer* b : {&h1, &r1, &d2, &m2, &dd2, &dr1, &dh1}) {
      *b = gpu::DeviceBuffer(un * kHidden);
    }
    for (gpu::DeviceBuffer* b : {&logits, &logp, &dlogits}) {
      *b = gpu::DeviceBuffer(un * kNumClasses);
    }
  }

  int n;
  gpu::Conv2d conv1;
  gpu::Relu relu1;
  gpu::Conv2d conv2;
  gpu::MaxPool pool;
  gpu::Multiply drop1;
  gpu::Linear fc1;
  gpu::Relu relu2;
  gpu::Multiply drop2;
  gpu::Linear fc2;
  gpu::LogSoftmax softmax;
  // Activations (x ... logp), masks (m1, m2) and gradients (d...).
  gpu::DeviceBuffer x, c1, a1, c2, p, d1, m1, h1, r1, d2, m2, logits, logp;
  gpu::DeviceBuffer dlogits, dd2, dr1, dh1, dd1, dp, dc2, da1, dc1;
  const float* fc1_in = nullptr;  // d1, or p without dropout
  const float* fc2_in = nullptr;  // d2, or r1 without dropout
};

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_CUDA_BACKEND_H_
