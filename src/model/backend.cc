// The network layout, device names, backend factory and the loss (see
// backend.h).
#include "model/backend.h"

#include <glog/logging.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "model/cpu_backend.h"
#include "model/init.h"
#ifdef PS_HAVE_CUDA
#include "model/cuda_backend.h"
#endif

namespace ps {
namespace model {

const std::vector<TensorView>& ConvNetTensors() {
  static const std::vector<TensorView> views = LayOut({
      {"conv1.weight", {kConv1Channels, 1, kKernel, kKernel}},
      {"conv1.bias", {kConv1Channels}},
      {"conv2.weight", {kConv2Channels, kConv1Channels, kKernel, kKernel}},
      {"conv2.bias", {kConv2Channels}},
      {"fc1.weight", {kHidden, kFlatFeatures}},
      {"fc1.bias", {kHidden}},
      {"fc2.weight", {kNumClasses, kHidden}},
      {"fc2.bias", {kNumClasses}},
  });
  return views;
}

StatusOr<Device> ParseDevice(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return Status::InvalidArgument("device must be cpu or cuda, got '" + name +
                                 "'");
}

const char* DeviceName(Device device) {
  return device == Device::kCpu ? "cpu" : "cuda";
}

StatusOr<std::unique_ptr<Backend>> MakeBackend(Device device) {
  if (device == Device::kCpu) {
    std::unique_ptr<Backend> b = std::make_unique<CpuBackend>();
    return b;
  }
#ifdef PS_HAVE_CUDA
  return MakeCudaBackend();
#else
  return Status::Unavailable(
      "device cuda: this build has no CUDA backend (configured with "
      "PS_WITH_CUDA=OFF or without the CUDA toolkit)");
#endif
}

void SetCpuThreads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

float LogSoftmaxNll(const float* logits, const int32_t* labels, int n, int c,
                    float* log_probs, float* dlogits, float label_smoothing) {
  for (int i = 0; i < n; ++i) {
    const float* z = logits + static_cast<size_t>(i) * c;
    float* lp = log_probs + static_cast<size_t>(i) * c;
    const float zmax = *std::max_element(z, z + c);
    double sum = 0.0;
    for (int j = 0; j < c; ++j)
      sum += std::exp(static_cast<double>(z[j] - zmax));
    const float log_sum = static_cast<float>(std::log(sum)) + zmax;
    for (int j = 0; j < c; ++j) lp[j] = z[j] - log_sum;
  }
  return NllFromLogProbs(log_probs, labels, n, c, dlogits, label_smoothing);
}

float NllFromLogProbs(const float* log_probs, const int32_t* labels, int n,
                      int c, float* dlogits, float label_smoothing) {
  const float e = label_smoothing;
  const float off = e / c;  // every class's share of the smoothing
  double loss = 0.0;
  for (int i = 0; i < n; ++i) {
    const float* lp = log_probs + static_cast<size_t>(i) * c;
    CHECK(labels[i] >= 0 && labels[i] < c) << "label " << labels[i];
    loss -= (1.0 - e) * lp[labels[i]];
    if (e != 0.0f) {
      double sum = 0.0;
      for (int j = 0; j < c; ++j) sum += lp[j];
      loss -= off * sum;
    }
    if (dlogits != nullptr) {
      float* d = dlogits + static_cast<size_t>(i) * c;
      for (int j = 0; j < c; ++j) {
        const float target = (j == labels[i] ? 1.0f - e : 0.0f) + off;
        d[j] = (std::exp(lp[j]) - target) / n;
      }
    }
  }
  return static_cast<float>(loss / n);
}

}  // namespace model
}  // namespace ps
