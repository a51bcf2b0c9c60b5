// Every CUDA op (cuDNN / cuBLAS) against the CPU op (oneDNN) on the same
// inputs, and the whole CUDA backend against the CPU backend. Skipped, with
// cudaGetDeviceCount's answer, where no GPU is present.
#include "model/cuda_ops.h"

#include <gtest/gtest.h>

#include <numeric>

#include "grad_check.h"
#include "model/backend.h"
#include "model/cpu_backend.h"
#include "model/cpu_ops.h"
#include "model/cuda_backend.h"
#include "model/init.h"

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
