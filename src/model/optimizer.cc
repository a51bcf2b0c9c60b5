// SGD, Adam and StepLR with torch.optim's update rules (see optimizer.h).
#include "model/optimizer.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ps {
namespace model {
namespace {
// Below this many floats a step is not worth waking OpenMP's threads.
constexpr size_t kParallelMin = 1 << 16;
}  // namespace

Sgd::Sgd(size_t n, float lr, float momentum, float weight_decay, bool nesterov)
    : Optimizer(n, lr),
      momentum_(momentum),
      weight_decay_(weight_decay),
      nesterov_(nesterov) {
  if (momentum_ != 0.0f) buf_.assign(n, 0.0f);
}

// The loops below are elementwise, so results do not depend on the thread
// count, and read their state through local restrict pointers so that they
// vectorise (this file is built with -fno-math-errno for sqrt).

void Sgd::Step(float* w, const float* g, size_t n) {
  CHECK_EQ(n, n_) << "Sgd built for " << n_ << " floats";
  const bool first = first_;
  const float scale = grad_scale_, lr = lr_, decay = weight_decay_,
              momentum = momentum_;
  const bool nesterov = nesterov_;
  float* __restrict buf = buf_.data();
  float* __restrict wr = w;
  const float* __restrict gr = g;
#pragma omp parallel for simd if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    float d = gr[i] * scale + decay * wr[i];
    if (momentum != 0.0f) {
      buf[i] = first ? d : momentum * buf[i] + d;
      d = nesterov ? d + momentum * buf[i] : buf[i];
    }
    wr[i] -= lr * d;
  }
  first_ = false;
}

Adam::Adam(size_t n, float lr, float beta1, float beta2, float eps,
           float weight_decay)
    : Optimizer(n, lr),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      weight_decay_(weight_decay),
      m_(n, 0.0f),
      v_(n, 0.0f) {}

void Adam::Step(float* w, const float* g, size_t n) {
  CHECK_EQ(n, n_) << "Adam built for " << n_ << " floats";
  ++t_;
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1_), t_);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2_), t_);
  const float step_size = static_cast<float>(lr_ / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float scale = grad_scale_, decay = weight_decay_, eps = eps_;
  const float one_minus_b1 = 1.0f - beta1_, b2 = beta2_,
              one_minus_b2 = 1.0f - beta2_;
  float* __restrict m = m_.data();
  float* __restrict v = v_.data();
  float* __restrict wr = w;
  const float* __restrict gr = g;
#pragma omp parallel for simd if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    const float d = gr[i] * scale + decay * wr[i];
    m[i] += (d - m[i]) * one_minus_b1;  // torch: exp_avg.lerp_(grad, 1-b1)
    v[i] = b2 * v[i] + one_minus_b2 * d * d;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    wr[i] -= step_size * m[i] / denom;
  }
}

namespace {
// State bytes: a tag naming the kind, the float count, a counter, floats.
std::string PackState(char kind, int64_t counter,
                      const std::vector<const std::vector<float>*>& arrays) {
  std::string out(1, kind);
  out.append(reinterpret_cast<const char*>(&counter), sizeof(counter));
  for (const std::vector<float>* a : arrays) {
    out.append(reinterpret_cast<const char*>(a->data()),
               a->size() * sizeof(float));
  }
  return out;
}

Status UnpackState(const std::string& in, char kind, const char* name,
                   int64_t* counter,
                   const std::vector<std::vector<float>*>& arrays) {
  size_t want = 1 + sizeof(*counter);
  for (const std::vector<float>* a : arrays) want += a->size() * sizeof(float);
  if (in.empty() || in[0] != kind || in.size() != want) {
    return Status::InvalidArgument(
        std::string(name) + " state of " + std::to_string(in.size()) +
        " bytes does not fit this optimizer (" + std::to_string(want) +
        " bytes of " + name + ")");
  }
  std::memcpy(counter, in.data() + 1, sizeof(*counter));
  size_t at = 1 + sizeof(*counter);
  for (std::vector<float>* a : arrays) {
    std::memcpy(a->data(), in.data() + at, a->size() * sizeof(float));
    at += a->size() * sizeof(float);
  }
  return Status::OK();
}
}  // namespace

std::string Sgd::SaveState() const {
  return PackState('S', first_ ? 1 : 0, {&buf_});
}

Status Sgd::LoadState(const std::string& state) {
  int64_t first = 0;
  PS_RETURN_IF_ERROR(UnpackState(state, 'S', "sgd", &first, {&buf_}));
  first_ = first != 0;
  return Status::OK();
}

std::string Adam::SaveState() const { return PackState('A', t_, {&m_, &v_}); }

Status Adam::LoadState(const std::string& state) {
  return UnpackState(state, 'A', "adam", &t_, {&m_, &v_});
}

StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& c,
                                                   size_t n) {
  if (!(c.lr > 0.0f)) {
    return Status::InvalidArgument("optimizer lr must be > 0, got " +
                                   std::to_string(c.lr));
  }
  if (c.weight_decay < 0.0f) {
    return Status::InvalidArgument("optimizer weight_decay must be >= 0, got " +
                                   std::to_string(c.weight_decay));
  }
  if (c.name == "sgd") {
    if (c.momentum < 0.0f || c.momentum >= 1.0f) {
      return Status::InvalidArgument("sgd momentum must be in [0, 1), got " +
                                     std::to_string(c.momentum));
    }
    if (c.nesterov && c.momentum == 0.0f) {
      return Status::InvalidArgument("sgd nesterov needs momentum > 0");
    }
    std::unique_ptr<Optimizer> sgd =
        std::make_unique<Sgd>(n, c.lr, c.momentum, c.weight_decay, c.nesterov);
    return sgd;
  }
  if (c.name == "adam") {
    if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f) ||
        !(c.beta2 >= 0.0f && c.beta2 < 1.0f)) {
      return Status::InvalidArgument(
          "adam betas must be in [0, 1), got beta1 " + std::to_string(c.beta1) +
          ", beta2 " + std::to_string(c.beta2));
    }
    std::unique_ptr<Optimizer> adam = std::make_unique<Adam>(
        n, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay);
    return adam;
  }
  return Status::InvalidArgument("optimizer must be sgd or adam, got '" +
                                 c.name + "'");
}

StepLR::StepLR(float base_lr, int step_size, float gamma)
    : base_lr_(base_lr), step_size_(step_size), gamma_(gamma) {
  CHECK_GT(step_size, 0);
}

float StepLR::LrAt(int epoch) const {
  return base_lr_ * static_cast<float>(std::pow(static_cast<double>(gamma_),
                                                epoch / step_size_));
}

StatusOr<LrScheduleConfig::Kind> ParseLrSchedule(const std::string& name) {
  if (name == "step") return LrScheduleConfig::Kind::kStep;
  if (name == "onecycle") return LrScheduleConfig::Kind::kOneCycle;
  return Status::InvalidArgument("lr schedule must be step or onecycle, got '" +
                                 name + "'");
}

LrSchedule::LrSchedule(const LrScheduleConfig& c) : c_(c) {
  CHECK_GT(c.step_size, 0);
  if (c.kind == LrScheduleConfig::Kind::kOneCycle) {
    CHECK_GT(c.total_steps, 0);
    CHECK(c.warmup_steps >= 0 && c.warmup_steps < c.total_steps)
        << c.warmup_steps << " warmup steps of " << c.total_steps;
  }
}

float LrSchedule::LrAt(int64_t step, int period) const {
  if (c_.kind == LrScheduleConfig::Kind::kStep) {
    return c_.base_lr *
           static_cast<float>(
               std::pow(static_cast<double>(c_.gamma), period / c_.step_size));
  }
  // torch.optim.lr_scheduler.OneCycleLR's start: peak / 25.
  constexpr double kStartFraction = 1.0 / 25.0;
  double fraction;
  if (step < c_.warmup_steps) {
    const double t = static_cast<double>(step) / c_.warmup_steps;
    fraction = kStartFraction + (1.0 - kStartFraction) * t;
  } else {
    const double t = static_cast<double>(step - c_.warmup_steps) /
                     static_cast<double>(c_.total_steps - c_.warmup_steps);
    fraction = std::max(0.0, 1.0 - t);
  }
  return static_cast<float>(c_.base_lr * fraction);
}

}  // namespace model
}  // namespace ps
