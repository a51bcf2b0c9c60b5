// The CPU forward and backward pass of the ConvNet (see cpu_backend.h).
#include "model/cpu_backend.h"

#include <glog/logging.h>

#include <vector>

namespace ps {
namespace model {

using cpu::memory;
using cpu::PlainDesc;

struct CpuBackend::Plan {
  Plan(cpu::DnnlContext* ctx, int batch)
      : n(batch),
        x_md(PlainDesc({n, 1, kImageSide, kImageSide})),
        conv1(ctx, x_md, kConv1Channels, kKernel),
        relu1(ctx, conv1.dst_desc()),
        conv2(ctx, conv1.dst_desc(), kConv2Channels, kKernel),
        pool(ctx, conv2.dst_desc(), 2),
        fc1(ctx, n, kFlatFeatures, kHidden),
        relu2(ctx, PlainDesc({n, kHidden})),
        fc2(ctx, n, kHidden, kNumClasses) {
    const auto& e = ctx->engine;
    c1 = memory(conv1.dst_desc(), e);
    a1 = memory(conv1.dst_desc(), e);
    c2 = memory(conv2.dst_desc(), e);
    p = memory(pool.dst_desc(), e);
    dc1 = memory(conv1.dst_desc(), e);
    da1 = memory(conv1.dst_desc(), e);
    dc2 = memory(conv2.dst_desc(), e);
    const size_t un = static_cast<size_t>(n);
    flat.resize(un * kFlatFeatures);
    drop1.resize(un * kFlatFeatures);
    dflat.resize(un * kFlatFeatures);
    h1.resize(un * kHidden);
    r1.resize(un * kHidden);
    drop2.resize(un * kHidden);
    dh1.resize(un * kHidden);
    dr1.resize(un * kHidden);
    logits.resize(un * kNumClasses);
    dlogits.resize(un * kNumClasses);
    flat_md = PlainDesc({n, kConv2Channels, kPooledSide, kPooledSide});
    hidden_md = PlainDesc({n, kHidden});
  }

  int n;
  memory::desc x_md, flat_md, hidden_md;
  cpu::Conv2dOp conv1;
  cpu::ReluOp relu1;
  cpu::Conv2dOp conv2;
  cpu::MaxPoolOp pool;
  cpu::LinearOp fc1;
  cpu::ReluOp relu2;
  cpu::LinearOp fc2;
  // Activations in layer layouts, and their gradients.
  memory c1, a1, c2, p, dc1, da1, dc2, dp_buf;
  // Plain [n, ...] buffers from the flatten on.
  std::vector<float> flat, drop1, dflat, h1, r1, drop2, dh1, dr1, logits,
      dlogits;
  const float* fc1_in = nullptr;  // drop1 or flat (no dropout)
  const float* fc2_in = nullptr;  // drop2 or r1
};

namespace {

const float* Param(const float* params, ConvNetTensor t) {
  return params + ConvNetTensors()[t].offset;
}
float* Grad(float* grads, ConvNetTensor t) {
  return grads + ConvNetTensors()[t].offset;
}

// out = in * mask, or in itself when mask is null.
const float* ApplyMask(const std::vector<float>& in, const float* mask,
                       std::vector<float>* out) {
  if (mask == nullptr) return in.data();
  for (size_t i = 0; i < in.size(); ++i) (*out)[i] = in[i] * mask[i];
  return out->data();
}

void MaskInPlace(std::vector<float>* v, const float* mask) {
  if (mask == nullptr) return;
  for (size_t i = 0; i < v->size(); ++i) (*v)[i] *= mask[i];
}

}  // namespace

CpuBackend::CpuBackend() = default;
CpuBackend::~CpuBackend() = default;

CpuBackend::Plan* CpuBackend::GetPlan(int n) {
  CHECK_GT(n, 0);
  auto& plan = plans_[n];
  if (!plan) plan = std::make_unique<Plan>(&ctx_, n);
  return plan.get();
}

void CpuBackend::RunForward(Plan* p, const float* params, const float* images,
                            const float* mask1, const float* mask2) {
  const auto& e = ctx_.engine;
  p->conv1.Forward(memory(p->x_md, e, const_cast<float*>(images)),
                   Param(params, kConv1Weight), Param(params, kConv1Bias),
                   p->c1);
  p->relu1.Forward(p->c1, p->a1);
  p->conv2.Forward(p->a1, Param(params, kConv2Weight),
                   Param(params, kConv2Bias), p->c2);
  p->pool.Forward(p->c2, p->p);
  cpu::Reorder(&ctx_, p->p, memory(p->flat_md, e, p->flat.data()));
  p->fc1_in = ApplyMask(p->flat, mask1, &p->drop1);
  p->fc1.Forward(p->fc1_in, Param(params, kFc1Weight), Param(params, kFc1Bias),
                 p->h1.data());
  p->relu2.Forward(memory(p->hidden_md, e, p->h1.data()),
                   memory(p->hidden_md, e, p->r1.data()));
  p->fc2_in = ApplyMask(p->r1, mask2, &p->drop2);
  p->fc2.Forward(p->fc2_in, Param(params, kFc2Weight), Param(params, kFc2Bias),
                 p->logits.data());
}

float CpuBackend::ForwardBackward(const float* params, float* grads,
                                  const float* images, const int32_t* labels,
                                  int n, const float* mask1, const float* mask2,
                                  const GradsReady* ready) {
  Plan* p = GetPlan(n);
  const auto& e = ctx_.engine;
  RunForward(p, params, images, mask1, mask2);
  std::vector<float> log_probs(p->logits.size());
  const float loss =
      LogSoftmaxNll(p->logits.data(), labels, n, kNumClasses, log_probs.data(),
                    p->dlogits.data(), label_smoothing_);

  p->fc2.BackwardWeights(p->fc2_in, p->dlogits.data(), Grad(grads, kFc2Weight),
                         Grad(grads, kFc2Bias));
  p->fc2.BackwardData(p->dlogits.data(), Param(params, kFc2Weight),
                      p->dr1.data());
  MaskInPlace(&p->dr1, mask2);
  p->relu2.Backward(memory(p->hidden_md, e, p->h1.data()),
                    memory(p->hidden_md, e, p->dr1.data()),
                    memory(p->hidden_md, e, p->dh1.data()));
  p->fc1.BackwardWeights(p->fc1_in, p->dh1.data(), Grad(grads, kFc1Weight),
                         Grad(grads, kFc1Bias));
  p->fc1.BackwardData(p->dh1.data(), Param(params, kFc1Weight),
                      p->dflat.data());
  // The fc layers' grads are final and their params no longer read: the
  // rest of the pass (most of its time) touches only the conv tensors.
  if (ready != nullptr) (*ready)(ConvNetTensors()[kFc1Weight].offset);
  MaskInPlace(&p->dflat, mask1);
  memory dp = cpu::InLayout(&ctx_, memory(p->flat_md, e, p->dflat.data()),
                            p->pool.dst_desc(), &p->dp_buf);
  p->pool.Backward(dp, p->dc2);
  p->conv2.BackwardWeights(p->a1, p->dc2, Grad(grads, kConv2Weight),
                           Grad(grads, kConv2Bias));
  p->conv2.BackwardData(p->dc2, Param(params, kConv2Weight), p->da1);
  p->relu1.Backward(p->c1, p->da1, p->dc1);
  p->conv1.BackwardWeights(memory(p->x_md, e, const_cast<float*>(images)),
                           p->dc1, Grad(grads, kConv1Weight),
                           Grad(grads, kConv1Bias));
  return loss;
}

void CpuBackend::Forward(const float* params, const float* images, int n,
                         float* log_probs) {
  Plan* p = GetPlan(n);
  RunForward(p, params, images, nullptr, nullptr);
  std::vector<int32_t> zeros(static_cast<size_t>(n), 0);
  LogSoftmaxNll(p->logits.data(), zeros.data(), n, kNumClasses, log_probs,
                nullptr);
}

}  // namespace model
}  // namespace ps
