// SGD, Adam and StepLR with torch.optim's update rules (see optimizer.h).
#include "model/optimizer.h"

#include <glog/logging.h>

#include <cmath>

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

void Sgd::Step(float* w, const float* g, size_t n) {
  CHECK_EQ(n, n_) << "Sgd built for " << n_ << " floats";
  const bool first = first_;
  // Elementwise, so the result does not depend on the thread count.
#pragma omp parallel for if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    float d = g[i];
    if (weight_decay_ != 0.0f) d += weight_decay_ * w[i];
    if (momentum_ != 0.0f) {
      buf_[i] = first ? d : momentum_ * buf_[i] + d;
      d = nesterov_ ? d + momentum_ * buf_[i] : buf_[i];
    }
    w[i] -= lr_ * d;
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
#pragma omp parallel for if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    float d = g[i];
    if (weight_decay_ != 0.0f) d += weight_decay_ * w[i];
    m_[i] += (d - m_[i]) * (1.0f - beta1_);  // torch: exp_avg.lerp_(grad, 1-b1)
    v_[i] = beta2_ * v_[i] + (1.0f - beta2_) * d * d;
    const float denom = std::sqrt(v_[i]) / bc2_sqrt + eps_;
    w[i] -= step_size * m_[i] / denom;
  }
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

}  // namespace model
}  // namespace ps
