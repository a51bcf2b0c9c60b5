// Optimizers that update any slice of the flat parameter buffer in place, with
// the semantics of torch.optim.SGD and torch.optim.Adam (weight decay as L2
// added to the gradient, as those classes do). A server builds one for its
// shard; a single-process trainer builds one for the whole model.
//
// Thread-safety: an optimizer owns its state (momentum, moments, step count)
// and is not thread-safe; distinct optimizers may run on distinct threads.
// A Step over 65536 floats or more is spread over the OpenMP threads
// (elementwise, so results do not depend on the thread count).
#ifndef PS_MODEL_OPTIMIZER_H_
#define PS_MODEL_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ps/status.h"

namespace ps {
namespace model {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // w[i] -= update(g[i] * grad_scale()) for i < n. n must equal size(); w
  // and g must not overlap. The state advances by one step per call.
  virtual void Step(float* w, const float* g, size_t n) = 0;
  size_t size() const { return n_; }
  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  // What every gradient is multiplied by first (e.g. 1/W, to average the
  // sum of W workers' gradients without a pass of its own); 1 by default.
  float grad_scale() const { return grad_scale_; }
  void set_grad_scale(float scale) { grad_scale_ = scale; }
  // The state (momentum buffer, moments, step count) as bytes, for a
  // checkpoint; LoadState takes what SaveState of an optimizer of the same
  // kind and size wrote (InvalidArgument saying what differs otherwise).
  // Neither lr nor grad_scale is state: the caller sets them every step.
  virtual std::string SaveState() const = 0;
  virtual Status LoadState(const std::string& state) = 0;

 protected:
  Optimizer(size_t n, float lr) : n_(n), lr_(lr) {}

  const size_t n_;  // floats this optimizer keeps state for
  float lr_;
  float grad_scale_ = 1.0f;
};

// torch.optim.SGD(lr, momentum, dampening=0, weight_decay, nesterov).
class Sgd : public Optimizer {
 public:
  Sgd(size_t n, float lr, float momentum = 0.0f, float weight_decay = 0.0f,
      bool nesterov = false);
  void Step(float* w, const float* g, size_t n) override;
  std::string SaveState() const override;
  Status LoadState(const std::string& state) override;

 private:
  float momentum_, weight_decay_;
  bool nesterov_;
  bool first_ = true;
  std::vector<float> buf_;  // momentum buffer, empty when momentum == 0
};

// torch.optim.Adam(lr, betas=(beta1, beta2), eps, weight_decay, amsgrad=False).
class Adam : public Optimizer {
 public:
  Adam(size_t n, float lr = 1e-3f, float beta1 = 0.9f, float beta2 = 0.999f,
       float eps = 1e-8f, float weight_decay = 0.0f);
  void Step(float* w, const float* g, size_t n) override;
  std::string SaveState() const override;
  Status LoadState(const std::string& state) override;

 private:
  float beta1_, beta2_, eps_, weight_decay_;
  int64_t t_ = 0;
  std::vector<float> m_, v_;  // first and second moments
};

// What a trainer or server needs to build an optimizer for n floats.
struct OptimizerConfig {
  std::string name = "adam";  // "sgd" or "adam"
  float lr = 1e-3f;
  float momentum = 0.0f;                            // sgd only
  bool nesterov = false;                            // sgd only
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adam only
  float weight_decay = 0.0f;
};

// InvalidArgument naming the field and value for an unknown name or a
// negative lr / momentum / weight decay.
StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& c,
                                                   size_t n);

// torch.optim.lr_scheduler.StepLR: lr = base_lr * gamma^(epoch / step_size),
// epoch counted from 0.
class StepLR {
 public:
  StepLR(float base_lr, int step_size, float gamma);
  float LrAt(int epoch) const;

 private:
  float base_lr_;
  int step_size_;
  float gamma_;
};

// The learning rate of every step of a run:
//   kStep      StepLR over periods (an epoch, or N steps: the caller says
//              which period a step is in): base_lr * gamma^(period / step_size)
//   kOneCycle  warmup then decay over the run's planned steps: linear from
//              base_lr / 25 to base_lr over the first warmup_steps, then
//              linear down to 0 at total_steps (later steps: 0). The peak,
//              base_lr, is what --lr names.
// Every node that applies an optimizer computes the same rate from the step
// number alone, so a server needs no more than the step a push carries.
struct LrScheduleConfig {
  enum class Kind { kStep, kOneCycle };
  Kind kind = Kind::kStep;
  float base_lr = 1e-3f;
  int step_size = 1;  // kStep: periods between decays
  float gamma = 1.0f;
  int64_t total_steps = 0;  // kOneCycle: > 0
  int64_t warmup_steps = 0;
};

// "step" or "onecycle"; InvalidArgument naming the value otherwise.
StatusOr<LrScheduleConfig::Kind> ParseLrSchedule(const std::string& name);

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleConfig& c);
  // The rate of step `step` (from 0), which lies in StepLR period `period`.
  float LrAt(int64_t step, int period) const;

 private:
  LrScheduleConfig c_;
};

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_OPTIMIZER_H_
