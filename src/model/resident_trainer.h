// Single-process training that keeps the parameters, gradients, optimizer
// state and dropout masks on the backend's device between steps: the host
// sends each batch and reads back only the loss and, when it asks, the
// parameters. This is the GPU's way to train alone (mnist_local --device
// cuda); a parameter-server worker cannot use it, since its parameters come
// from pulls into host memory every step (Net::ForwardBackward does that).
//
// Not thread-safe: one thread drives a trainer.
#ifndef PS_MODEL_RESIDENT_TRAINER_H_
#define PS_MODEL_RESIDENT_TRAINER_H_

#include <cstdint>
#include <memory>

#include "model/backend.h"
#include "model/optimizer.h"
#include "ps/status.h"

namespace ps {
namespace model {

struct ResidentConfig {
  OptimizerConfig optimizer;     // the update, as MakeOptimizer takes it
  bool dropout = true;           // the network's two dropout layers
  uint64_t dropout_seed = 1;     // the device generator's seed
  float label_smoothing = 0.0f;  // of the loss (NllFromLogProbs)
};

class ResidentTrainer {
 public:
  virtual ~ResidentTrainer() = default;
  // Queues one step on n images [n, 1, 28, 28] (normalised) with labels in
  // [0, 10): forward, backward and the optimizer's update. Returns once the
  // inputs are copied; the device may still be computing.
  virtual void Step(const float* images, const int32_t* labels, int n) = 0;
  // The mean loss of the steps since the last call (waits for them); 0 when
  // there were none.
  virtual float TakeMeanLoss() = 0;
  virtual void set_lr(float lr) = 0;
  // Copies the parameters into params [num_params] (waits for the steps).
  virtual void CopyParams(float* params) = 0;
};

// A trainer on `device` starting from params [ConvNetTensors()' total].
// InvalidArgument for the CPU (its Net already trains in host memory);
// Unavailable when the build or the machine has no CUDA device;
// InvalidArgument naming the field for a bad optimizer config.
StatusOr<std::unique_ptr<ResidentTrainer>> MakeResidentTrainer(
    Device device, const float* params, const ResidentConfig& config);

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_RESIDENT_TRAINER_H_
