// A Python DenseServer's optimizers and checkpoint payload (dense_state.h).
#include "dense_state.h"

#include <cstring>

namespace ps {
namespace python {

void RangeOptimizers::Update(float* w, const float* grad_sum, size_t offset,
                             size_t n, int num_grads, int step, int tag) {
  auto& opt = optimizers_[{offset, n}];
  // The config was checked when the server was made.
  if (!opt) opt = std::move(model::MakeOptimizer(config_, n)).value();
  opt->set_grad_scale(1.0f / static_cast<float>(num_grads));
  opt->set_lr(schedule_.LrAt(step, tag));
  opt->Step(w, grad_sum, n);
  // One update of the slice per step: count the range that ends it.
  if (offset + n == slice_size_) ++updates_;
}

void RangeOptimizers::Save(Packer* out) const {
  out->Put<int32_t>(updates_);
  out->Put<uint64_t>(optimizers_.size());
  for (const auto& [range, optimizer] : optimizers_) {
    out->Put<uint64_t>(range.first);
    out->Put<uint64_t>(range.second);
    out->PutString(optimizer->SaveState());
  }
}

Status RangeOptimizers::Load(Unpacker* in) {
  uint64_t count;
  if (!in->Get(&updates_) || !in->Get(&count)) {
    return Status::Corruption("no optimizer state");
  }
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t offset, n;
    std::string state;
    if (!in->Get(&offset) || !in->Get(&n) || !in->GetString(&state) ||
        offset + n > slice_size_) {
      return Status::Corruption("optimizer state " + std::to_string(i) +
                                " is cut short or outside the slice");
    }
    StatusOr<std::unique_ptr<model::Optimizer>> made =
        model::MakeOptimizer(config_, n);
    if (!made.ok()) return made.status();
    Status st = (*made)->LoadState(state);
    if (!st.ok()) return st;
    optimizers_[{offset, n}] = std::move(made).value();
  }
  return Status::OK();
}

std::string SlicePayload(const float* w, size_t n,
                         const RangeOptimizers& optimizers) {
  Packer out;
  out.PutBytes(w, n * sizeof(float));
  optimizers.Save(&out);
  return out.data();
}

Status LoadSlicePayload(const std::string& payload, std::vector<float>* slice,
                        RangeOptimizers* optimizers) {
  Unpacker in(payload);
  std::string floats;
  if (!in.GetString(&floats) ||
      floats.size() != slice->size() * sizeof(float)) {
    return Status::Corruption("weights are not the " +
                              std::to_string(slice->size()) +
                              " floats of this server's slice");
  }
  std::memcpy(slice->data(), floats.data(), floats.size());
  Status st = CheckFinite(slice->data(), slice->size(), "the weights");
  if (st.ok()) st = optimizers->Load(&in);
  if (st.ok() && !in.done()) st = Status::Corruption("trailing bytes");
  return st;
}

}  // namespace python
}  // namespace ps
