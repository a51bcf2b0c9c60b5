// The ConvNet on flat buffers and its evaluation loop (see net.h).
#include "model/net.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "model/init.h"

namespace ps {
namespace model {

namespace {

std::shared_ptr<float> HeapFloats(size_t n) {
  constexpr size_t kAlign = 64;
  const size_t bytes = (n * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  return std::shared_ptr<float>(
      static_cast<float*>(std::aligned_alloc(kAlign, bytes)), std::free);
}

}  // namespace

StatusOr<std::unique_ptr<Net>> Net::Create(Device device, uint64_t seed,
                                           const FloatAllocator& alloc) {
  auto backend = MakeBackend(device);
  if (!backend.ok()) return backend.status();
  std::unique_ptr<Net> net(new Net(std::move(*backend), alloc));
  net->InitParams(seed);
  net->SeedDropout(seed ^ 0xD509D509D509D509ull);
  return net;
}

Net::Net(std::unique_ptr<Backend> backend, const FloatAllocator& alloc)
    : backend_(std::move(backend)),
      num_params_(TotalCount(ConvNetTensors())),
      params_(alloc ? alloc(num_params_) : HeapFloats(num_params_)),
      grads_(alloc ? alloc(num_params_) : HeapFloats(num_params_)) {
  CHECK(params_ != nullptr && grads_ != nullptr)
      << "no memory for " << num_params_ << " parameters";
}

std::string Net::DropoutState() const {
  std::ostringstream out;
  out << dropout_rng_;
  return out.str();
}

bool Net::SetDropoutState(const std::string& state) {
  std::istringstream in(state);
  std::mt19937_64 rng;
  in >> rng;
  if (in.fail()) return false;
  dropout_rng_ = rng;
  return true;
}

void Net::InitParams(uint64_t seed) {
  model::InitParams(tensors(), seed, params_.get());
  std::fill(grads_.get(), grads_.get() + num_params_, 0.0f);
}

float Net::ForwardBackward(const float* images, const int32_t* labels, int n,
                           const GradsReady& ready) {
  CHECK_GT(n, 0);
  const float* m1 = nullptr;
  const float* m2 = nullptr;
  if (training_) {
    const size_t un = static_cast<size_t>(n);
    mask1_.resize(un * kFlatFeatures);
    mask2_.resize(un * kHidden);
    FillDropoutMask(&dropout_rng_, kDropout1, mask1_.data(), mask1_.size());
    FillDropoutMask(&dropout_rng_, kDropout2, mask2_.data(), mask2_.size());
    m1 = mask1_.data();
    m2 = mask2_.data();
  }
  return backend_->ForwardBackward(params_.get(), grads_.get(), images, labels,
                                   n, m1, m2, ready ? &ready : nullptr);
}

void Net::Predict(const float* images, int n, float* log_probs) {
  CHECK_GT(n, 0);
  backend_->Forward(params_.get(), images, n, log_probs);
}

EvalResult Evaluate(Net* net, const Dataset& data, int batch_size,
                    size_t limit) {
  CHECK_GT(batch_size, 0);
  const size_t n = limit == 0 ? data.size : std::min(limit, data.size);
  const size_t pixels = data.image_floats();
  std::vector<float> log_probs(static_cast<size_t>(batch_size) * kNumClasses);
  EvalResult r;
  double loss = 0.0;
  size_t correct = 0;
  for (size_t start = 0; start < n; start += batch_size) {
    const int m = static_cast<int>(std::min<size_t>(batch_size, n - start));
    net->Predict(data.images.data() + start * pixels, m, log_probs.data());
    for (int i = 0; i < m; ++i) {
      const float* lp = log_probs.data() + static_cast<size_t>(i) * kNumClasses;
      const int32_t label = data.labels[start + i];
      loss -= lp[label];
      if (std::max_element(lp, lp + kNumClasses) - lp == label) ++correct;
    }
  }
  r.count = n;
  if (n > 0) {
    r.loss = loss / static_cast<double>(n);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  }
  return r;
}

}  // namespace model
}  // namespace ps
