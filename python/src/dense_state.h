// What a Python DenseServer keeps of one slice besides its weights: the
// optimizer of every pushed range (src/model: torch.optim.SGD / Adam
// semantics) with its learning-rate schedule (model::LrSchedule: StepLR over
// the push's tag, or one-cycle over its step), and the slice's checkpoint
// payload. The payload is mnist_dist's
// (examples/mnist/dist_server.cc): the slice's floats, the updates counted,
// then each range's (offset, n, optimizer state), so that one file format
// serves both trainers.
//
// Not thread-safe: Update, Save and Load run on the shard's receive thread
// (Load before the shard exists).
#ifndef PS_PYTHON_DENSE_STATE_H_
#define PS_PYTHON_DENSE_STATE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kv/checkpointer.h"
#include "model/optimizer.h"
#include "ps/status.h"

namespace ps {
namespace python {

// One optimizer per pushed range (offset, n): SGD and Adam are elementwise,
// so this equals one optimizer over the slice.
class RangeOptimizers {
 public:
  // `schedule` must satisfy model::LrSchedule (checked by the caller); its
  // base_lr is the optimizer's peak lr.
  RangeOptimizers(model::OptimizerConfig config,
                  const model::LrScheduleConfig& schedule, size_t slice_size)
      : config_(std::move(config)),
        schedule_(schedule),
        slice_size_(slice_size) {}

  // The update of the gradient of `step`, a push tagged `tag` (the StepLR
  // period).
  void Update(float* w, const float* grad_sum, size_t offset, size_t n,
              int num_grads, int step, int tag);

  // The updates counted and every range's optimizer state.
  void Save(Packer* out) const;
  Status Load(Unpacker* in);

 private:
  const model::OptimizerConfig config_;
  const model::LrSchedule schedule_;
  const size_t slice_size_;
  std::map<std::pair<size_t, size_t>, std::unique_ptr<model::Optimizer>>
      optimizers_;       // by (offset, n)
  int32_t updates_ = 0;  // of the whole slice: ranges that end it
};

// A slice's checkpoint payload: its n weights, then the optimizers'.
std::string SlicePayload(const float* w, size_t n,
                         const RangeOptimizers& optimizers);

// Fills *slice (its size is the slice's) and *optimizers from a payload;
// Corruption saying what does not fit, non-finite weights included.
Status LoadSlicePayload(const std::string& payload, std::vector<float>* slice,
                        RangeOptimizers* optimizers);

}  // namespace python
}  // namespace ps

#endif  // PS_PYTHON_DENSE_STATE_H_
