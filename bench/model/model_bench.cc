// model_bench: samples/s of the ConvNet's forward + backward on the CPU at
// batch 32, 64 and 128, the GFLOP/s that amounts to, and the machine's sgemm
// GFLOP/s (oneDNN's dnnl_sgemm and OpenBLAS's cblas_sgemm, at 1024^3 and at
// the network's own GEMM shapes) measured in the same run, with the ratio.
//
// FLOPs are counted analytically: 2 per multiply-add of conv and linear
// layers in the forward pass; forward + backward counts 3x the forward.
#include <cblas.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "model/backend.h"
#include "model/init.h"
#include "model/net.h"

DEFINE_int32(reps, 7, "timed repetitions (the median is reported)");
DEFINE_double(rep_s, 0.5, "seconds per repetition (at least one call)");
DEFINE_int32(threads, 0, "threads (0: all cores)");

namespace {

using Clock = std::chrono::steady_clock;
using namespace ps::model;  // NOLINT: a program, not a library

// Median seconds per call of fn over FLAGS_reps repetitions, after warm-up.
double MedianSecondsPerCall(const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  const auto t0 = Clock::now();
  fn();
  const double one = std::chrono::duration<double>(Clock::now() - t0).count();
  const int calls = std::max(1, static_cast<int>(FLAGS_rep_s / one));
  std::vector<double> per_call;
  for (int r = 0; r < FLAGS_reps; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) fn();
    per_call.push_back(
        std::chrono::duration<double>(Clock::now() - start).count() / calls);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

// Forward multiply-adds of one example.
double ForwardMacsPerSample() {
  const double conv1 = 26.0 * 26 * kConv1Channels * 1 * kKernel * kKernel;
  const double conv2 =
      24.0 * 24 * kConv2Channels * kConv1Channels * kKernel * kKernel;
  const double fc1 = double{kFlatFeatures} * kHidden;
  const double fc2 = double{kHidden} * kNumClasses;
  return conv1 + conv2 + fc1 + fc2;
}

struct Gemm {
  const char* what;
  int m, n, k;
};

// GFLOP/s of C[m,n] = A[m,k] B[k,n] (row-major) with dnnl_sgemm, or
// cblas_sgemm when openblas.
double SgemmGflops(const Gemm& g, bool openblas) {
  std::vector<float> a = std::vector<float>(size_t(g.m) * g.k, 0.5f);
  std::vector<float> b(size_t(g.k) * g.n, 0.25f), c(size_t(g.m) * g.n);
  const double s = MedianSecondsPerCall([&] {
    if (openblas) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g.m, g.n, g.k,
                  1.0f, a.data(), g.k, b.data(), g.n, 0.0f, c.data(), g.n);
    } else {
      CHECK_EQ(dnnl_sgemm('N', 'N', g.m, g.n, g.k, 1.0f, a.data(), g.k,
                          b.data(), g.n, 0.0f, c.data(), g.n),
               dnnl_success);
    }
  });
  return 2.0 * g.m * g.n * g.k / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  SetCpuThreads(FLAGS_threads);
  if (FLAGS_threads > 0) openblas_set_num_threads(FLAGS_threads);
  const double fwd_flops = 2.0 * ForwardMacsPerSample();
  const double train_flops = 3.0 * fwd_flops;
  std::printf(
      "model_bench: %d OpenMP threads; forward %.2f MFLOP/sample, "
      "forward+backward %.2f MFLOP/sample (3x forward)\n",
      omp_get_max_threads(), fwd_flops / 1e6, train_flops / 1e6);

  auto net_or = Net::Create(Device::kCpu, 1);
  CHECK(net_or.ok()) << net_or.status();
  Net& net = **net_or;
  std::printf("\n%-8s %12s %12s %10s\n", "batch", "ms/step", "samples/s",
              "GFLOP/s");
  double gflops_at_64 = 0;
  for (int batch : {32, 64, 128}) {
    std::vector<float> images(size_t(batch) * 784);
    std::mt19937_64 rng(batch);
    for (auto& x : images) x = UniformFloat(&rng, -0.4f, 2.8f);
    std::vector<int32_t> labels(batch);
    for (int i = 0; i < batch; ++i) labels[i] = i % 10;
    const double s = MedianSecondsPerCall(
        [&] { net.ForwardBackward(images.data(), labels.data(), batch); });
    const double gflops = batch * train_flops / s / 1e9;
    if (batch == 64) gflops_at_64 = gflops;
    std::printf("%-8d %12.2f %12.0f %10.1f\n", batch, s * 1e3, batch / s,
                gflops);
  }

  const std::vector<Gemm> gemms = {
      {"1024^3", 1024, 1024, 1024},
      {"conv2 fwd as GEMM, batch 64 (64 x 36864 x 288)", 64, 36864, 288},
      {"fc1 fwd, batch 64 (64 x 128 x 9216)", 64, 128, 9216},
      {"fc1 dW, batch 64 (128 x 9216 x 64)", 128, 9216, 64},
  };
  std::printf("\n%-50s %12s %12s\n", "sgemm shape (M x N x K)", "oneDNN",
              "OpenBLAS");
  std::vector<double> dnnl_rates, blas_rates;
  for (const auto& g : gemms) dnnl_rates.push_back(SgemmGflops(g, false));
  for (const auto& g : gemms) blas_rates.push_back(SgemmGflops(g, true));
  for (size_t i = 0; i < gemms.size(); ++i) {
    std::printf("%-50s %12.1f %12.1f\n", gemms[i].what, dnnl_rates[i],
                blas_rates[i]);
  }
  const double best = std::max(dnnl_rates[0], blas_rates[0]);
  std::printf(
      "\nbatch 64: %.1f GFLOP/s = %.0f%% of oneDNN sgemm 1024^3, "
      "%.0f%% of OpenBLAS sgemm 1024^3, %.0f%% of the faster "
      "(bar: 70%%)\n",
      gflops_at_64, 100 * gflops_at_64 / dnnl_rates[0],
      100 * gflops_at_64 / blas_rates[0], 100 * gflops_at_64 / best);
  return 0;
}
