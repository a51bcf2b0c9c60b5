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
  struct Plan;  // the ops and device activations of one batch size
  Plan* GetPlan(int n);
  void RunForward(Plan* p, const float* params, const float* images,
                  const float* mask1, const float* mask2);

  gpu::CudaContext ctx_;
  gpu::DeviceBuffer params_, grads_;
  std::map<int, std::unique_ptr<Plan>> plans_;
};

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_CUDA_BACKEND_H_
