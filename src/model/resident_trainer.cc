// The resident trainer's factory (see resident_trainer.h).
#include "model/resident_trainer.h"

#ifdef PS_HAVE_CUDA
#include "model/cuda_trainer.h"
#endif

namespace ps {
namespace model {

StatusOr<std::unique_ptr<ResidentTrainer>> MakeResidentTrainer(
    Device device, const float* params, const ResidentConfig& config) {
  if (device == Device::kCpu) {
    return Status::InvalidArgument(
        "device cpu: no resident trainer (the CPU trains in host memory: "
        "Net::ForwardBackward and an Optimizer)");
  }
#ifdef PS_HAVE_CUDA
  return MakeCudaTrainer(params, config);
#else
  return Status::Unavailable(
      "device cuda: this build has no CUDA backend (configured with "
      "PS_WITH_CUDA=OFF or without the CUDA toolkit)");
#endif
}

}  // namespace model
}  // namespace ps
