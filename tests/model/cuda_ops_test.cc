// Every CUDA op (cuDNN / cuBLAS) against the CPU op (oneDNN) on the same
// inputs, and the whole CUDA backend against the CPU backend. Skipped, with
// cudaGetDeviceCount's answer, where no GPU is present.
#include "model/cuda_ops.h"

#include <cuda_runtime.h>
#include <glog/logging.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "grad_check.h"
#include "model/backend.h"
#include "model/cpu_backend.h"
#include "model/cpu_ops.h"
#include "model/cuda_backend.h"
#include "model/cuda_kernels.h"
#include "model/init.h"
#include "model/optimizer.h"
#include "model/resident_trainer.h"

namespace ps {
namespace model {
namespace {

using cpu::memory;
using cpu::PlainDesc;
using gpu::DeviceBuffer;
using testing::RandomVector;

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status s = gpu::CudaDeviceStatus();
    if (!s.ok()) GTEST_SKIP() << "no CUDA device: " << s.message();
    gpu_ = std::make_unique<gpu::CudaContext>();
  }
  DeviceBuffer Up(const std::vector<float>& v) {
    DeviceBuffer b(v.size());
    b.Upload(v.data(), v.size());
    return b;
  }
  std::vector<float> Down(const DeviceBuffer& b) {
    std::vector<float> v(b.size());
    b.Download(v.data(), v.size());
    return v;
  }
  memory Plain(const memory::dims& dims, std::vector<float>* v) {
    return memory(PlainDesc(dims), cpu_.engine, v->data());
  }
  std::vector<float> ToPlain(const memory& m) {
    const auto dims = m.get_desc().dims();
    std::vector<float> out(std::accumulate(dims.begin(), dims.end(), size_t{1},
                                           std::multiplies<size_t>()));
    cpu::Reorder(&cpu_, m, Plain(dims, &out));
    return out;
  }
  memory FromPlain(std::vector<float> v, const memory::desc& md) {
    memory m(md, cpu_.engine);
    cpu::Reorder(&cpu_, Plain(md.dims(), &v), m);
    return m;
  }
  static void ExpectNear(const std::vector<float>& cpu,
                         const std::vector<float>& gpu, double tol,
                         const char* what) {
    ASSERT_EQ(cpu.size(), gpu.size()) << what;
    double max_err = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      max_err = std::max(max_err, std::fabs(double{cpu[i]} - gpu[i]) /
                                      (1.0 + std::fabs(double{cpu[i]})));
    }
    EXPECT_LE(max_err, tol) << what;
  }
  cpu::DnnlContext cpu_;
  std::unique_ptr<gpu::CudaContext> gpu_;
};

TEST_F(CudaOpsTest, Conv2dMatchesCpu) {
  const int n = 4, ic = 16, hw = 10, oc = 32, k = 3, ohw = hw - k + 1;
  const memory::dims xd{n, ic, hw, hw};
  auto x = RandomVector(n * ic * hw * hw, 1), w = RandomVector(oc * ic * 9, 2),
       b = RandomVector(oc, 3), dy = RandomVector(n * oc * ohw * ohw, 4);
  cpu::Conv2dOp c(&cpu_, PlainDesc(xd), oc, k);
  memory y(c.dst_desc(), cpu_.engine);
  c.Forward(Plain(xd, &x), w.data(), b.data(), y);
  std::vector<float> dx(x.size()), dw(w.size()), db(b.size());
  memory dym = FromPlain(dy, c.dst_desc());
  c.BackwardData(dym, w.data(), Plain(xd, &dx));
  c.BackwardWeights(Plain(xd, &x), dym, dw.data(), db.data());

  gpu::Conv2d g(gpu_.get(), n, ic, hw, hw, oc, k);
  DeviceBuffer gx = Up(x), gw = Up(w), gb = Up(b), gdy = Up(dy), gy(dy.size()),
               gdx(x.size()), gdw(w.size()), gdb(b.size());
  g.Forward(gx.get(), gw.get(), gb.get(), gy.get());
  g.BackwardData(gdy.get(), gw.get(), gdx.get());
  g.BackwardWeights(gx.get(), gdy.get(), gdw.get(), gdb.get());
  ExpectNear(ToPlain(y), Down(gy), 1e-4, "y");
  ExpectNear(dx, Down(gdx), 1e-4, "dx");
  ExpectNear(dw, Down(gdw), 1e-4, "dw");
  ExpectNear(db, Down(gdb), 1e-4, "db");
}

TEST_F(CudaOpsTest, ReluAndMaxPoolMatchCpu) {
  const memory::dims d{2, 16, 8, 8};
  const size_t size = 2 * 16 * 8 * 8;
  auto x = RandomVector(size, 5), dy = RandomVector(size, 6),
       dyp = RandomVector(size / 4, 7);
  std::vector<float> y(size), dx(size);
  cpu::ReluOp relu(&cpu_, PlainDesc(d));
  relu.Forward(Plain(d, &x), Plain(d, &y));
  relu.Backward(Plain(d, &x), Plain(d, &dy), Plain(d, &dx));
  cpu::MaxPoolOp pool(&cpu_, PlainDesc(d), 2);
  memory py(pool.dst_desc(), cpu_.engine);
  std::vector<float> pdx(size);
  pool.Forward(Plain(d, &x), py);
  pool.Backward(FromPlain(dyp, pool.dst_desc()), Plain(d, &pdx));

  gpu::Relu grelu(gpu_.get(), 2, 16, 8, 8);
  gpu::MaxPool gpool(gpu_.get(), 2, 16, 8, 8, 2);
  DeviceBuffer gx = Up(x), gdy = Up(dy), gdyp = Up(dyp), gy(size), gdx(size),
               gpy(size / 4), gpdx(size);
  grelu.Forward(gx.get(), gy.get());
  grelu.Backward(gx.get(), gy.get(), gdy.get(), gdx.get());
  gpool.Forward(gx.get(), gpy.get());
  gpool.Backward(gx.get(), gpy.get(), gdyp.get(), gpdx.get());
  ExpectNear(y, Down(gy), 0, "relu y");
  ExpectNear(dx, Down(gdx), 0, "relu dx");
  ExpectNear(ToPlain(py), Down(gpy), 0, "pool y");
  ExpectNear(pdx, Down(gpdx), 0, "pool dx");
}

TEST_F(CudaOpsTest, LinearMatchesCpu) {
  const int n = 8, in = 300, out = 20;
  auto x = RandomVector(n * in, 8), w = RandomVector(out * in, 9),
       b = RandomVector(out, 10), dy = RandomVector(n * out, 11);
  std::vector<float> y(n * out), dx(x.size()), dw(w.size()), db(out);
  cpu::LinearOp fc(&cpu_, n, in, out);
  fc.Forward(x.data(), w.data(), b.data(), y.data());
  fc.BackwardData(dy.data(), w.data(), dx.data());
  fc.BackwardWeights(x.data(), dy.data(), dw.data(), db.data());
  gpu::Linear g(gpu_.get(), n, in, out);
  DeviceBuffer gx = Up(x), gw = Up(w), gb = Up(b), gdy = Up(dy), gy(y.size()),
               gdx(x.size()), gdw(w.size()), gdb(out);
  g.Forward(gx.get(), gw.get(), gb.get(), gy.get());
  g.BackwardData(gdy.get(), gw.get(), gdx.get());
  g.BackwardWeights(gx.get(), gdy.get(), gdw.get(), gdb.get());
  ExpectNear(y, Down(gy), 1e-4, "y");
  ExpectNear(dx, Down(gdx), 1e-4, "dx");
  ExpectNear(dw, Down(gdw), 1e-4, "dw");
  ExpectNear(db, Down(gdb), 1e-4, "db");
}

TEST_F(CudaOpsTest, LogSoftmaxAndMultiplyMatchCpu) {
  const int n = 5, c = 10;
  auto z = RandomVector(n * c, 12, -4, 4), m = RandomVector(n * c, 13);
  const int32_t labels[n] = {0, 1, 2, 3, 9};
  std::vector<float> lp(z.size());
  LogSoftmaxNll(z.data(), labels, n, c, lp.data(), nullptr);
  gpu::LogSoftmax gs(gpu_.get(), n, c);
  gpu::Multiply gm(gpu_.get(), n * c);
  DeviceBuffer gz = Up(z), gmask = Up(m), glp(z.size()), gprod(z.size());
  gs.Forward(gz.get(), glp.get());
  gm.Forward(gz.get(), gmask.get(), gprod.get());
  ExpectNear(lp, Down(glp), 1e-5, "log_softmax");
  std::vector<float> prod(z.size());
  for (size_t i = 0; i < z.size(); ++i) prod[i] = z[i] * m[i];
  ExpectNear(prod, Down(gprod), 0, "multiply");
}

TEST_F(CudaOpsTest, BackendMatchesCpuWithDropout) {
  const int n = 16;
  const auto& t = ConvNetTensors();
  std::vector<float> params(TotalCount(t));
  InitParams(t, 7, params.data());
  auto images = RandomVector(n * 784, 14, -0.4f, 2.8f);
  std::vector<int32_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = i % 10;
  std::mt19937_64 rng(15);
  std::vector<float> m1(n * kFlatFeatures), m2(n * kHidden);
  FillDropoutMask(&rng, kDropout1, m1.data(), m1.size());
  FillDropoutMask(&rng, kDropout2, m2.data(), m2.size());
  CpuBackend cpu;
  CudaBackend cuda;
  std::vector<float> gc(params.size()), gg(params.size());
  const float lc =
      cpu.ForwardBackward(params.data(), gc.data(), images.data(),
                          labels.data(), n, m1.data(), m2.data(), nullptr);
  const float lg =
      cuda.ForwardBackward(params.data(), gg.data(), images.data(),
                           labels.data(), n, m1.data(), m2.data(), nullptr);
  EXPECT_NEAR(lc, lg, 1e-4);
  ExpectNear(gc, gg, 1e-4, "grads");
  std::vector<float> pc(n * kNumClasses), pg(n * kNumClasses);
  cpu.Forward(params.data(), images.data(), n, pc.data());
  cuda.Forward(params.data(), images.data(), n, pg.data());
  ExpectNear(pc, pg, 1e-4, "log_probs");
}

TEST_F(CudaOpsTest, OptimizerKernelsMatchTheCpuOptimizers) {
  const size_t n = 100003;  // not a multiple of the block size
  const auto w0 = RandomVector(n, 21), g = RandomVector(n, 22, -0.1f, 0.1f);
  OptimizerConfig c;
  c.weight_decay = 0.01f;
  auto adam = MakeOptimizer(c, n);
  ASSERT_TRUE(adam.ok()) << adam.status();
  std::vector<float> wc = w0;
  DeviceBuffer gw = Up(w0), gg = Up(g), gm(n), gv(n);
  for (int t = 1; t <= 3; ++t) {
    (*adam)->Step(wc.data(), g.data(), n);
    const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), t);
    const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), t);
    gpu::AdamConstants k{1.0f,           c.weight_decay,
                         1.0f - c.beta1, c.beta2,
                         1.0f - c.beta2, static_cast<float>(std::sqrt(bc2)),
                         c.eps,          static_cast<float>(c.lr / bc1)};
    gpu::AdamStep(gw.get(), gg.get(), gm.get(), gv.get(), n, k);
  }
  ExpectNear(wc, Down(gw), 1e-6, "adam");

  c.name = "sgd";
  c.momentum = 0.9f;
  auto sgd = MakeOptimizer(c, n);
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  wc = w0;
  gw = Up(w0);
  DeviceBuffer gbuf(n);
  for (int t = 1; t <= 3; ++t) {
    (*sgd)->Step(wc.data(), g.data(), n);
    gpu::SgdConstants k{1.0f, c.weight_decay, c.lr, c.momentum, false, t == 1};
    gpu::SgdStep(gw.get(), gg.get(), gbuf.get(), n, k);
  }
  ExpectNear(wc, Down(gw), 1e-6, "sgd");
}

TEST_F(CudaOpsTest, DropoutMaskAndNllKernelsMatchTheCpu) {
  const size_t n = 1 << 20;
  auto u = RandomVector(n, 23, 0.0f, 1.0f);
  for (float& x : u) x = 1.0f - x;  // (0, 1], as cuRAND draws
  DeviceBuffer gu = Up(u);
  gpu::DropoutMaskFromUniform(gu.get(), n, kDropout1);
  const auto mask = Down(gu);
  size_t dropped = 0;
  for (size_t i = 0; i < n; ++i) {
    const float want = 1.0f - u[i] < kDropout1 ? 0.0f : 1.0f / (1 - kDropout1);
    ASSERT_EQ(mask[i], want) << "element " << i << " of uniform " << u[i];
    dropped += mask[i] == 0.0f;
  }
  // 1M draws at p = 0.25: the standard deviation of the count is 443.
  EXPECT_NEAR(static_cast<double>(dropped), 0.25 * n, 5000.0);

  const int rows = 37, c = kNumClasses;
  auto z = RandomVector(rows * c, 24, -4, 4);
  std::vector<int32_t> labels(rows);
  for (int i = 0; i < rows; ++i) labels[i] = (i * 7) % c;
  std::vector<float> lp(z.size()), d(z.size());
  LogSoftmaxNll(z.data(), labels.data(), rows, c, lp.data(), nullptr);
  const float loss =
      NllFromLogProbs(lp.data(), labels.data(), rows, c, d.data());
  DeviceBuffer glp = Up(lp), gd(z.size()), gloss(1), glabels(rows);
  static_assert(sizeof(int32_t) == sizeof(float), "labels ride in floats");
  CHECK_EQ(cudaMemcpy(glabels.get(), labels.data(), rows * sizeof(int32_t),
                      cudaMemcpyHostToDevice),
           cudaSuccess);
  gpu::NllGrad(glp.get(), reinterpret_cast<const int32_t*>(glabels.get()), rows,
               c, gd.get(), gloss.get());
  ExpectNear(d, Down(gd), 1e-6, "dlogits");
  EXPECT_NEAR(Down(gloss)[0], loss, 1e-5);
  // With label smoothing, as the host's.
  const float smoothed =
      NllFromLogProbs(lp.data(), labels.data(), rows, c, d.data(), 0.1f);
  DeviceBuffer gloss2(1);
  gpu::NllGrad(glp.get(), reinterpret_cast<const int32_t*>(glabels.get()), rows,
               c, gd.get(), gloss2.get(), 0.1f);
  ExpectNear(d, Down(gd), 1e-6, "smoothed dlogits");
  EXPECT_NEAR(Down(gloss2)[0], smoothed, 1e-5);
}

// Three SGD steps with momentum, no dropout: on the device throughout, and
// the host's way (the CUDA backend's pass, the CPU optimizer).
TEST_F(CudaOpsTest, ResidentTrainerMatchesHostSteps) {
  const int n = 32;
  const auto& t = ConvNetTensors();
  std::vector<float> params(TotalCount(t));
  InitParams(t, 7, params.data());
  ResidentConfig rc;
  rc.optimizer.name = "sgd";
  rc.optimizer.lr = 0.05f;
  rc.optimizer.momentum = 0.9f;
  rc.dropout = false;
  auto trainer = MakeResidentTrainer(Device::kCuda, params.data(), rc);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto sgd = MakeOptimizer(rc.optimizer, params.size());
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  CudaBackend cuda;
  std::vector<float> host = params, grads(params.size());
  float host_loss = 0.0f;
  for (int step = 0; step < 3; ++step) {
    auto images = RandomVector(n * 784, 30 + step, -0.4f, 2.8f);
    std::vector<int32_t> labels(n);
    for (int i = 0; i < n; ++i) labels[i] = (i + step) % 10;
    (*trainer)->Step(images.data(), labels.data(), n);
    host_loss +=
        cuda.ForwardBackward(host.data(), grads.data(), images.data(),
                             labels.data(), n, nullptr, nullptr, nullptr);
    (*sgd)->Step(host.data(), grads.data(), host.size());
  }
  EXPECT_NEAR((*trainer)->TakeMeanLoss(), host_loss / 3, 1e-4);
  std::vector<float> device(params.size());
  (*trainer)->CopyParams(device.data());
  ExpectNear(host, device, 1e-4, "params after 3 steps");
}

// With dropout drawn on the device and Adam, the loss on one repeated batch
// falls: masks, loss gradient and update work together.
TEST_F(CudaOpsTest, ResidentTrainerLearnsWithDropout) {
  const int n = 64;
  const auto& t = ConvNetTensors();
  std::vector<float> params(TotalCount(t));
  InitParams(t, 8, params.data());
  auto trainer = MakeResidentTrainer(Device::kCuda, params.data(), {});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto images = RandomVector(n * 784, 40, -0.4f, 2.8f);
  std::vector<int32_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = (i * 3) % 10;
  (*trainer)->Step(images.data(), labels.data(), n);
  const float first = (*trainer)->TakeMeanLoss();
  for (int step = 0; step < 60; ++step) {
    (*trainer)->Step(images.data(), labels.data(), n);
  }
  (*trainer)->TakeMeanLoss();
  (*trainer)->Step(images.data(), labels.data(), n);
  const float last = (*trainer)->TakeMeanLoss();
  EXPECT_GT(first, 2.0f);  // about ln 10 at the start
  EXPECT_LT(last, 0.5f * first) << "first " << first;
  std::vector<float> after(params.size());
  (*trainer)->CopyParams(after.data());
  for (float x : after) ASSERT_TRUE(std::isfinite(x));
}

TEST(CudaDeviceTest, ResidentTrainerNamesTheDevice) {
  const std::vector<float> params(TotalCount(ConvNetTensors()));
  auto cpu = MakeResidentTrainer(Device::kCpu, params.data(), {});
  ASSERT_FALSE(cpu.ok());
  EXPECT_NE(cpu.status().message().find("device cpu"), std::string::npos);
  ResidentConfig bad;
  bad.optimizer.name = "adagrad";
  auto wrong = MakeResidentTrainer(Device::kCuda, params.data(), bad);
  ASSERT_FALSE(wrong.ok());
  if (gpu::CudaDeviceStatus().ok()) {
    EXPECT_NE(wrong.status().message().find("adagrad"), std::string::npos)
        << wrong.status();
  }
}

TEST(CudaDeviceTest, NetCreateNamesTheDevice) {
  auto net = MakeBackend(Device::kCuda);
  if (gpu::CudaDeviceStatus().ok()) {
    EXPECT_TRUE(net.ok()) << net.status();
  } else {
    ASSERT_FALSE(net.ok());
    EXPECT_EQ(net.status().message().rfind("device cuda: no CUDA device: ", 0),
              0u)
        << net.status();
  }
}

}  // namespace
}  // namespace model
}  // namespace ps
