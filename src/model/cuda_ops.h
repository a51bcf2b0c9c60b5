// The ConvNet's layers on the GPU: cuDNN for convolution, pooling, ReLU,
// log-softmax and elementwise multiply (dropout masks); cuBLAS sgemm for the
// linear layers. Same shapes and plain layouts (NCHW, row-major [n, features])
// as the CPU ops; every pointer is device memory. Each op is built for one
// batch size. Convolutions run in full FP32 (no TF32) so results match the
// CPU within float rounding. CUDA, cuDNN and cuBLAS errors are bugs or fatal
// environment failures here and abort with the library's message; whether a
// device exists at all is asked first with CudaDeviceStatus().
//
// Not thread-safe; ops run in order on the default stream. Internal header,
// compiled only with PS_HAVE_CUDA.
#ifndef PS_MODEL_CUDA_OPS_H_
#define PS_MODEL_CUDA_OPS_H_

#include <cublas_v2.h>
#include <cudnn.h>

#include <cstddef>

#include "ps/status.h"

namespace ps {
namespace model {
namespace gpu {

// OK when a CUDA device can be used; Unavailable with cudaGetDeviceCount's
// error (or "0 devices") otherwise.
Status CudaDeviceStatus();

// cuDNN and cuBLAS handles on the current device.
class CudaContext {
 public:
  CudaContext();
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }

 private:
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

// Device memory of n floats (zeroed), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  float* get() const { return p_; }
  size_t size() const { return n_; }
  // Copies n <= size() floats from or to host memory (synchronous).
  void Upload(const float* host, size_t n);
  void Download(float* host, size_t n) const;

 private:
  float* p_ = nullptr;
  size_t n_ = 0;
};

// An NCHW float tensor descriptor.
class TensorDesc {
 public:
  TensorDesc(int n, int c, int h, int w);
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

// Conv2d, k x k, stride 1, no padding, with bias: x [n, ic, h, w] ->
// y [n, oc, h-k+1, w-k+1]; w [oc, ic, k, k]; b [oc].
class Conv2d {
 public:
  Conv2d(CudaContext* ctx, int n, int ic, int h, int w, int oc, int k);
  ~Conv2d();
  void Forward(const float* x, const float* w, const float* b, float* y);
  void BackwardData(const float* dy, const float* w, float* dx);
  void BackwardWeights(const float* x, const float* dy, float* dw, float* db);

 private:
  CudaContext* ctx_;
  TensorDesc x_, y_, b_;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo_;
  cudnnConvolutionBwdDataAlgo_t bwd_algo_;
  cudnnConvolutionBwdFilterAlgo_t bww_algo_;
  DeviceBuffer workspace_;
};

// ReLU on [n, c, h, w].
class Relu {
 public:
  Relu(CudaContext* ctx, int n, int c, int h, int w);
  ~Relu();
  void Forward(const float* x, float* y);
  void Backward(const float* x, const float* y, const float* dy, float* dx);

 private:
  CudaContext* ctx_;
  TensorDesc t_;
  cudnnActivationDescriptor_t act_ = nullptr;
};

// Max pooling, k x k window, stride k: [n, c, h, w] -> [n, c, h/k, w/k].
class MaxPool {
 public:
  MaxPool(CudaContext* ctx, int n, int c, int h, int w, int k);
  ~MaxPool();
  void Forward(const float* x, float* y);
  void Backward(const float* x, const float* y, const float* dy, float* dx);

 private:
  CudaContext* ctx_;
  TensorDesc x_, y_;
  cudnnPoolingDescriptor_t pool_ = nullptr;
};

// Linear: x [n, in] -> y [n, out] = x W^T + b; W [out, in] row-major.
class Linear {
 public:
  Linear(CudaContext* ctx, int n, int in, int out);
  void Forward(const float* x, const float* w, const float* b, float* y);
  void BackwardData(const float* dy, const float* w, float* dx);
  void BackwardWeights(const float* x, const float* dy, float* dw, float* db);

 private:
  CudaContext* ctx_;
  int n_, in_, out_;
  TensorDesc y_, b_;
};

// Row-wise log-softmax of [n, c] (CUDNN_SOFTMAX_LOG).
class LogSoftmax {
 public:
  LogSoftmax(CudaContext* ctx, int n, int c);
  void Forward(const float* x, float* y);

 private:
  CudaContext* ctx_;
  TensorDesc t_;
};

// out = a * b elementwise over n floats (dropout: activation times mask).
class Multiply {
 public:
  Multiply(CudaContext* ctx, int n);
  ~Multiply();
  void Forward(const float* a, const float* b, float* out);

 private:
  CudaContext* ctx_;
  TensorDesc t_;
  cudnnOpTensorDescriptor_t op_ = nullptr;
};

}  // namespace gpu
}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_CUDA_OPS_H_
