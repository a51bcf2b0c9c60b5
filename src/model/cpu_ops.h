// The ConvNet's CPU layers on oneDNN primitives. Each op is built once for one
// batch size and input layout, creates its primitives then, and is reused for
// every batch of that size. Convolutions and pooling use the layouts oneDNN
// prefers (blocked, e.g. nChw16c): an op's output is in its dst_desc(), and
// inputs are reordered only when their layout differs from the primitive's.
// Parameters and their gradients are plain PyTorch layouts in flat buffers.
//
// Contract: a gradient ("diff") tensor has the layout of the tensor it is the
// gradient of. Ops are not thread-safe; each runs on the context's stream,
// which uses the process's OpenMP threads. Internal header (not installed).
#ifndef PS_MODEL_CPU_OPS_H_
#define PS_MODEL_CPU_OPS_H_

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>

namespace ps {
namespace model {
namespace cpu {

using dnnl::memory;

// An engine and an in-order stream on the CPU. Outlives every op built on it.
struct DnnlContext {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

// A plain (NCHW / NC / X) float32 descriptor.
memory::desc PlainDesc(const memory::dims& dims);

// Copies `from` into `to`, converting the layout; waits for it.
void Reorder(DnnlContext* ctx, const memory& from, const memory& to);

// Returns `m` if it already has layout `want`, else reorders it into `*buf`
// (allocated on first use with layout `want`) and returns that.
memory InLayout(DnnlContext* ctx, const memory& m, const memory::desc& want,
                memory* buf);

// Conv2d with a k x k kernel, stride 1, no padding, with bias.
// src [n, ic, h, w] -> dst [n, oc, h - k + 1, w - k + 1]; weights
// [oc, ic, k, k] and bias [oc] as plain floats.
class Conv2dOp {
 public:
  Conv2dOp(DnnlContext* ctx, const memory::desc& src_md, int oc, int k);
  const memory::desc& dst_desc() const { return dst_md_; }
  void Forward(const memory& src, const float* w, const float* b,
               const memory& dst);
  // diff_src (layout of src) = d loss / d src.
  void BackwardData(const memory& diff_dst, const float* w,
                    const memory& diff_src);
  // dw, db (plain) = d loss / d weights, bias (overwritten, not added).
  void BackwardWeights(const memory& src, const memory& diff_dst, float* dw,
                       float* db);

 private:
  DnnlContext* ctx_;
  memory::desc src_md_, dst_md_, w_md_, b_md_;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_weights::primitive_desc bww_pd_;
  dnnl::convolution_backward_weights bww_;
  // Built on first use: the first layer never needs it.
  dnnl::convolution_backward_data::primitive_desc bwd_pd_;
  dnnl::convolution_backward_data bwd_;
  memory src_buf_, w_buf_, bwd_w_buf_, bwd_dd_buf_, bwd_ds_buf_, bww_src_buf_,
      bww_dd_buf_, bww_dw_buf_;
};

// Elementwise ReLU on tensors of layout md.
class ReluOp {
 public:
  ReluOp(DnnlContext* ctx, const memory::desc& md);
  void Forward(const memory& src, const memory& dst);
  void Backward(const memory& src, const memory& diff_dst,
                const memory& diff_src);

 private:
  DnnlContext* ctx_;
  dnnl::eltwise_forward::primitive_desc fwd_pd_;
  dnnl::eltwise_forward fwd_;
  dnnl::eltwise_backward bwd_;
};

// Max pooling, k x k window, stride k. src [n, c, h, w] -> dst
// [n, c, h / k, w / k]. Keeps the argmax workspace of the last Forward, which
// Backward uses: call them in pairs.
class MaxPoolOp {
 public:
  MaxPoolOp(DnnlContext* ctx, const memory::desc& src_md, int k);
  const memory::desc& dst_desc() const { return dst_md_; }
  void Forward(const memory& src, const memory& dst);
  void Backward(const memory& diff_dst, const memory& diff_src);

 private:
  DnnlContext* ctx_;
  memory::desc dst_md_;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward bwd_;
  memory workspace_;
};

// Linear (inner product) on plain row-major buffers: x [n, in] ->
// y [n, out] = x W^T + b, W [out, in], b [out].
class LinearOp {
 public:
  LinearOp(DnnlContext* ctx, int n, int in, int out);
  void Forward(const float* x, const float* w, const float* b, float* y);
  void BackwardData(const float* dy, const float* w, float* dx);
  // dw, db overwritten.
  void BackwardWeights(const float* x, const float* dy, float* dw, float* db);

 private:
  DnnlContext* ctx_;
  memory::desc x_md_, w_md_, b_md_, y_md_;
  dnnl::inner_product_forward fwd_;
  dnnl::inner_product_backward_data bwd_;
  dnnl::inner_product_backward_weights bww_;
};

}  // namespace cpu
}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_CPU_OPS_H_
