// cuDNN and cuBLAS calls behind the GPU layers (see cuda_ops.h).
#include "model/cuda_ops.h"

#include <cuda_runtime.h>
#include <glog/logging.h>

#include <algorithm>
#include <string>

#define PS_CUDA_CHECK(expr)                                            \
  do {                                                                 \
    const cudaError_t e_ = (expr);                                     \
    CHECK_EQ(e_, cudaSuccess) << #expr ": " << cudaGetErrorString(e_); \
  } while (0)
#define PS_CUDNN_CHECK(expr)                      \
  do {                                            \
    const cudnnStatus_t s_ = (expr);              \
    CHECK_EQ(s_, CUDNN_STATUS_SUCCESS)            \
        << #expr ": " << cudnnGetErrorString(s_); \
  } while (0)
#define PS_CUBLAS_CHECK(expr)                                     \
  do {                                                            \
    const cublasStatus_t s_ = (expr);                             \
    CHECK_EQ(s_, CUBLAS_STATUS_SUCCESS) << #expr ": " << int{s_}; \
  } while (0)

namespace ps {
namespace model {
namespace gpu {
namespace {

const float kOne = 1.0f;
const float kZero = 0.0f;

// The fastest algorithm in cuDNN's measured ranking (sorted by time) that
// is usable, deterministic (the same inputs give the same bits) and plain
// FP32 (no TF32). Measuring once per batch size costs some milliseconds; the
// heuristics' first choice ran the network 2x slower at batch 512 on an
// H200 (bench/gpu/run.sh).
template <typename Perf>
auto FastestDeterministic(const Perf* perf, int count)
    -> decltype(perf[0].algo) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS &&
        perf[i].determinism == CUDNN_DETERMINISTIC &&
        perf[i].mathType == CUDNN_FMA_MATH) {
      return perf[i].algo;
    }
  }
  LOG(FATAL) << "cuDNN offers no deterministic FP32 convolution algorithm";
  return perf[0].algo;
}

}  // namespace

Status CudaDeviceStatus() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return Status::Unavailable(std::string("cudaGetDeviceCount: ") +
                               cudaGetErrorString(e));
  }
  if (count == 0) {
    return Status::Unavailable("cudaGetDeviceCount: 0 devices");
  }
  return Status::OK();
}

CudaContext::CudaContext() {
  PS_CUDNN_CHECK(cudnnCreate(&cudnn_));
  PS_CUBLAS_CHECK(cublasCreate(&cublas_));
}

CudaContext::~CudaContext() {
  cublasDestroy(cublas_);
  cudnnDestroy(cudnn_);
}

DeviceBuffer::DeviceBuffer(size_t n) : n_(n) {
  if (n == 0) return;
  void* p = nullptr;
  PS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  p_ = static_cast<float*>(p);
  PS_CUDA_CHECK(cudaMemset(p_, 0, n * sizeof(float)));
}

DeviceBuffer::~DeviceBuffer() {
  if (p_ != nullptr) cudaFree(p_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : p_(other.p_), n_(other.n_) {
  other.p_ = nullptr;
  other.n_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(p_, other.p_);
  std::swap(n_, other.n_);
  return *this;
}

void DeviceBuffer::Upload(const float* host, size_t n) {
  CHECK_LE(n, n_);
  PS_CUDA_CHECK(
      cudaMemcpy(p_, host, n * sizeof(float), cudaMemcpyHostToDevice));
}

void DeviceBuffer::Download(float* host, size_t n) const {
  CHECK_LE(n, n_);
  PS_CUDA_CHECK(
      cudaMemcpy(host, p_, n * sizeof(float), cudaMemcpyDeviceToHost));
}

TensorDesc::TensorDesc(int n, int c, int h, int w) {
  PS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_));
  PS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NCHW,
                                            CUDNN_DATA_FLOAT, n, c, h, w));
}

TensorDesc::~TensorDesc() { cudnnDestroyTensorDescriptor(d_); }

Conv2d::Conv2d(CudaContext* ctx, int n, int ic, int h, int w, int oc, int k)
    : ctx_(ctx),
      x_(n, ic, h, w),
      y_(n, oc, h - k + 1, w - k + 1),
      b_(1, oc, 1, 1) {
  PS_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
  PS_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, CUDNN_DATA_FLOAT,
                                            CUDNN_TENSOR_NCHW, oc, ic, k, k));
  PS_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_));
  PS_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      conv_, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  PS_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, CUDNN_FMA_MATH));
  cudnnHandle_t h_ = ctx->cudnn();
  // Measure every algorithm of each direction and keep the fastest.
  constexpr int kMaxAlgos = 16;
  int got = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMaxAlgos];
  PS_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(
      h_, x_.get(), w_, conv_, y_.get(), kMaxAlgos, &got, fwd));
  fwd_algo_ = FastestDeterministic(fwd, got);
  cudnnConvolutionBwdDataAlgoPerf_t bwd[kMaxAlgos];
  PS_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
      h_, w_, y_.get(), conv_, x_.get(), kMaxAlgos, &got, bwd));
  bwd_algo_ = FastestDeterministic(bwd, got);
  cudnnConvolutionBwdFilterAlgoPerf_t bww[kMaxAlgos];
  PS_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
      h_, x_.get(), y_.get(), conv_, w_, kMaxAlgos, &got, bww));
  bww_algo_ = FastestDeterministic(bww, got);
  size_t s1 = 0, s2 = 0, s3 = 0;
  PS_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
      h_, x_.get(), w_, conv_, y_.get(), fwd_algo_, &s1));
  PS_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
      h_, w_, y_.get(), conv_, x_.get(), bwd_algo_, &s2));
  PS_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
      h_, x_.get(), y_.get(), conv_, w_, bww_algo_, &s3));
  const size_t bytes = std::max({s1, s2, s3});
  workspace_ = DeviceBuffer((bytes + sizeof(float) - 1) / sizeof(float));
}

Conv2d::~Conv2d() {
  cudnnDestroyConvolutionDescriptor(conv_);
  cudnnDestroyFilterDescriptor(w_);
}

void Conv2d::Forward(const float* x, const float* w, const float* b, float* y) {
  PS_CUDNN_CHECK(cudnnConvolutionForward(ctx_->cudnn(), &kOne, x_.get(), x, w_,
                                         w, conv_, fwd_algo_, workspace_.get(),
                                         workspace_.size() * sizeof(float),
                                         &kZero, y_.get(), y));
  PS_CUDNN_CHECK(
      cudnnAddTensor(ctx_->cudnn(), &kOne, b_.get(), b, &kOne, y_.get(), y));
}

void Conv2d::BackwardData(const float* dy, const float* w, float* dx) {
  PS_CUDNN_CHECK(cudnnConvolutionBackwardData(
      ctx_->cudnn(), &kOne, w_, w, y_.get(), dy, conv_, bwd_algo_,
      workspace_.get(), workspace_.size() * sizeof(float), &kZero, x_.get(),
      dx));
}

void Conv2d::BackwardWeights(const float* x, const float* dy, float* dw,
                             float* db) {
  PS_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      ctx_->cudnn(), &kOne, x_.get(), x, y_.get(), dy, conv_, bww_algo_,
      workspace_.get(), workspace_.size() * sizeof(float), &kZero, w_, dw));
  PS_CUDNN_CHECK(cudnnConvolutionBackwardBias(ctx_->cudnn(), &kOne, y_.get(),
                                              dy, &kZero, b_.get(), db));
}

Relu::Relu(CudaContext* ctx, int n, int c, int h, int w)
    : ctx_(ctx), t_(n, c, h, w) {
  PS_CUDNN_CHECK(cudnnCreateActivationDescriptor(&act_));
  PS_CUDNN_CHECK(cudnnSetActivationDescriptor(act_, CUDNN_ACTIVATION_RELU,
                                              CUDNN_NOT_PROPAGATE_NAN, 0.0));
}

Relu::~Relu() { cudnnDestroyActivationDescriptor(act_); }

void Relu::Forward(const float* x, float* y) {
  PS_CUDNN_CHECK(cudnnActivationForward(ctx_->cudnn(), act_, &kOne, t_.get(), x,
                                        &kZero, t_.get(), y));
}

void Relu::Backward(const float* x, const float* y, const float* dy,
                    float* dx) {
  PS_CUDNN_CHECK(cudnnActivationBackward(ctx_->cudnn(), act_, &kOne, t_.get(),
                                         y, t_.get(), dy, t_.get(), x, &kZero,
                                         t_.get(), dx));
}

MaxPool::MaxPool(CudaContext* ctx, int n, int c, int h, int w, int k)
    : ctx_(ctx), x_(n, c, h, w), y_(n, c, h / k, w / k) {
  PS_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&pool_));
  PS_CUDNN_CHECK(cudnnSetPooling2dDescriptor(
      pool_, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, k, k, 0, 0, k, k));
}

MaxPool::~MaxPool() { cudnnDestroyPoolingDescriptor(pool_); }

void MaxPool::Forward(const float* x, float* y) {
  PS_CUDNN_CHECK(cudnnPoolingForward(ctx_->cudnn(), pool_, &kOne, x_.get(), x,
                                     &kZero, y_.get(), y));
}

void MaxPool::Backward(const float* x, const float* y, const float* dy,
                       float* dx) {
  PS_CUDNN_CHECK(cudnnPoolingBackward(ctx_->cudnn(), pool_, &kOne, y_.get(), y,
                                      y_.get(), dy, x_.get(), x, &kZero,
                                      x_.get(), dx));
}

// cuBLAS is column-major: a row-major [r, c] matrix is its transpose there.
Linear::Linear(CudaContext* ctx, int n, int in, int out)
    : ctx_(ctx),
      n_(n),
      in_(in),
      out_(out),
      y_(n, out, 1, 1),
      b_(1, out, 1, 1) {}

void Linear::Forward(const float* x, const float* w, const float* b, float* y) {
  // Y^T [out, n] = W [out, in] X^T [in, n].
  PS_CUBLAS_CHECK(cublasSgemm(ctx_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out_,
                              n_, in_, &kOne, w, in_, x, in_, &kZero, y, out_));
  PS_CUDNN_CHECK(
      cudnnAddTensor(ctx_->cudnn(), &kOne, b_.get(), b, &kOne, y_.get(), y));
}

void Linear::BackwardData(const float* dy, const float* w, float* dx) {
  // dX^T [in, n] = W^T [in, out] dY^T [out, n].
  PS_CUBLAS_CHECK(cublasSgemm(ctx_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, in_, n_,
                              out_, &kOne, w, in_, dy, out_, &kZero, dx, in_));
}

void Linear::BackwardWeights(const float* x, const float* dy, float* dw,
                             float* db) {
  // dW^T [in, out] = X^T [in, n] dY [n, out].
  PS_CUBLAS_CHECK(cublasSgemm(ctx_->cublas(), CUBLAS_OP_N, CUBLAS_OP_T, in_,
                              out_, n_, &kOne, x, in_, dy, out_, &kZero, dw,
                              in_));
  PS_CUDNN_CHECK(cudnnConvolutionBackwardBias(ctx_->cudnn(), &kOne, y_.get(),
                                              dy, &kZero, b_.get(), db));
}

LogSoftmax::LogSoftmax(CudaContext* ctx, int n, int c)
    : ctx_(ctx), t_(n, c, 1, 1) {}

void LogSoftmax::Forward(const float* x, float* y) {
  PS_CUDNN_CHECK(cudnnSoftmaxForward(ctx_->cudnn(), CUDNN_SOFTMAX_LOG,
                                     CUDNN_SOFTMAX_MODE_INSTANCE, &kOne,
                                     t_.get(), x, &kZero, t_.get(), y));
}

Multiply::Multiply(CudaContext* ctx, int n) : ctx_(ctx), t_(n, 1, 1, 1) {
  PS_CUDNN_CHECK(cudnnCreateOpTensorDescriptor(&op_));
  PS_CUDNN_CHECK(cudnnSetOpTensorDescriptor(
      op_, CUDNN_OP_TENSOR_MUL, CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN));
}

Multiply::~Multiply() { cudnnDestroyOpTensorDescriptor(op_); }

void Multiply::Forward(const float* a, const float* b, float* out) {
  PS_CUDNN_CHECK(cudnnOpTensor(ctx_->cudnn(), op_, &kOne, t_.get(), a, &kOne,
                               t_.get(), b, &kZero, t_.get(), out));
}

}  // namespace gpu
}  // namespace model
}  // namespace ps
