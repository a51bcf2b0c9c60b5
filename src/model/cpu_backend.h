// The ConvNet on the CPU: oneDNN layers (cpu_ops.h) chained per batch size,
// activations kept in oneDNN's preferred layouts between layers.
// Not thread-safe. Internal header.
#ifndef PS_MODEL_CPU_BACKEND_H_
#define PS_MODEL_CPU_BACKEND_H_

#include <map>
#include <memory>

#include "model/backend.h"
#include "model/cpu_ops.h"

namespace ps {
namespace model {

class CpuBackend : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override;
  float ForwardBackward(const float* params, float* grads, const float* images,
                        const int32_t* labels, int n, const float* mask1,
                        const float* mask2, const GradsReady* ready) override;
  void Forward(const float* params, const float* images, int n,
               float* log_probs) override;
  Device device() const override { return Device::kCpu; }

 private:
  struct Plan;  // the ops and activations of one batch size
  Plan* GetPlan(int n);
  // Runs the layers up to the logits; keeps activations in the plan.
  void RunForward(Plan* p, const float* params, const float* images,
                  const float* mask1, const float* mask2);

  cpu::DnnlContext ctx_;
  std::map<int, std::unique_ptr<Plan>> plans_;
};

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_CPU_BACKEND_H_
