// oneDNN primitives for the ConvNet's layers (see cpu_ops.h).
#include "model/cpu_ops.h"

#include <glog/logging.h>

namespace ps {
namespace model {
namespace cpu {
namespace {

using dnnl::algorithm;
using dnnl::prop_kind;
using Tag = memory::format_tag;
constexpr auto kF32 = memory::data_type::f32;

memory::desc AnyDesc(const memory::dims& dims) {
  return memory::desc(dims, kF32, Tag::any);
}

memory Wrap(DnnlContext* ctx, const memory::desc& md, const float* p) {
  // oneDNN takes void*; inputs are only read.
  return memory(md, ctx->engine, const_cast<float*>(p));
}

}  // namespace

memory::desc PlainDesc(const memory::dims& dims) {
  const Tag tag = dims.size() == 4   ? Tag::nchw
                  : dims.size() == 2 ? Tag::nc
                                     : Tag::x;
  CHECK(dims.size() == 4 || dims.size() == 2 || dims.size() == 1);
  return memory::desc(dims, kF32, tag);
}

void Reorder(DnnlContext* ctx, const memory& from, const memory& to) {
  memory src = from, dst = to;
  dnnl::reorder(src, dst).execute(ctx->stream, src, dst);
  ctx->stream.wait();
}

memory InLayout(DnnlContext* ctx, const memory& m, const memory::desc& want,
                memory* buf) {
  if (m.get_desc() == want) return m;
  if (!*buf) *buf = memory(want, ctx->engine);
  Reorder(ctx, m, *buf);
  return *buf;
}

namespace {

// Runs `run` with an output memory in layout `have` and delivers the result
// into `out` (whose layout may differ), through `*buf` when it must.
template <typename Run>
void IntoLayout(DnnlContext* ctx, const memory::desc& have, const memory& out,
                memory* buf, Run run) {
  if (have == out.get_desc()) {
    run(out);
    return;
  }
  if (!*buf) *buf = memory(have, ctx->engine);
  run(*buf);
  ctx->stream.wait();
  Reorder(ctx, *buf, out);
}

}  // namespace

Conv2dOp::Conv2dOp(DnnlContext* ctx, const memory::desc& src_md, int oc, int k)
    : ctx_(ctx), src_md_(src_md) {
  const memory::dims s = src_md.dims();
  CHECK_EQ(s.size(), 4u);
  const memory::dims w_dims{oc, s[1], k, k}, b_dims{oc};
  const memory::dims dst_dims{s[0], oc, s[2] - k + 1, s[3] - k + 1};
  const memory::dims strides{1, 1}, pad{0, 0};
  w_md_ = PlainDesc(w_dims);
  b_md_ = PlainDesc(b_dims);
  dnnl::convolution_forward::desc fd(
      prop_kind::forward_training, algorithm::convolution_direct, AnyDesc(s),
      AnyDesc(w_dims), b_md_, AnyDesc(dst_dims), strides, pad, pad);
  fwd_pd_ = dnnl::convolution_forward::primitive_desc(fd, ctx->engine);
  fwd_ = dnnl::convolution_forward(fwd_pd_);
  dst_md_ = fwd_pd_.dst_desc();
  dnnl::convolution_backward_weights::desc wd(
      algorithm::convolution_direct, AnyDesc(s), AnyDesc(w_dims), b_md_,
      AnyDesc(dst_dims), strides, pad, pad);
  bww_pd_ = dnnl::convolution_backward_weights::primitive_desc(wd, ctx->engine,
                                                               fwd_pd_);
  bww_ = dnnl::convolution_backward_weights(bww_pd_);
}

void Conv2dOp::Forward(const memory& src, const float* w, const float* b,
                       const memory& dst) {
  memory s = InLayout(ctx_, src, fwd_pd_.src_desc(), &src_buf_);
  memory wm =
      InLayout(ctx_, Wrap(ctx_, w_md_, w), fwd_pd_.weights_desc(), &w_buf_);
  fwd_.execute(ctx_->stream, {{DNNL_ARG_SRC, s},
                              {DNNL_ARG_WEIGHTS, wm},
                              {DNNL_ARG_BIAS, Wrap(ctx_, b_md_, b)},
                              {DNNL_ARG_DST, dst}});
  ctx_->stream.wait();
}

void Conv2dOp::BackwardData(const memory& diff_dst, const float* w,
                            const memory& diff_src) {
  if (!bwd_) {
    dnnl::convolution_backward_data::desc bd(
        algorithm::convolution_direct, AnyDesc(src_md_.dims()),
        AnyDesc(w_md_.dims()), AnyDesc(dst_md_.dims()), {1, 1}, {0, 0}, {0, 0});
    bwd_pd_ = dnnl::convolution_backward_data::primitive_desc(bd, ctx_->engine,
                                                              fwd_pd_);
    bwd_ = dnnl::convolution_backward_data(bwd_pd_);
  }
  memory dd = InLayout(ctx_, diff_dst, bwd_pd_.diff_dst_desc(), &bwd_dd_buf_);
  memory wm =
      InLayout(ctx_, Wrap(ctx_, w_md_, w), bwd_pd_.weights_desc(), &bwd_w_buf_);
  IntoLayout(ctx_, bwd_pd_.diff_src_desc(), diff_src, &bwd_ds_buf_,
             [&](const memory& out) {
               bwd_.execute(ctx_->stream, {{DNNL_ARG_DIFF_DST, dd},
                                           {DNNL_ARG_WEIGHTS, wm},
                                           {DNNL_ARG_DIFF_SRC, out}});
             });
  ctx_->stream.wait();
}

void Conv2dOp::BackwardWeights(const memory& src, const memory& diff_dst,
                               float* dw, float* db) {
  memory s = InLayout(ctx_, src, bww_pd_.src_desc(), &bww_src_buf_);
  memory dd = InLayout(ctx_, diff_dst, bww_pd_.diff_dst_desc(), &bww_dd_buf_);
  IntoLayout(ctx_, bww_pd_.diff_weights_desc(), Wrap(ctx_, w_md_, dw),
             &bww_dw_buf_, [&](const memory& out) {
               bww_.execute(ctx_->stream,
                            {{DNNL_ARG_SRC, s},
                             {DNNL_ARG_DIFF_DST, dd},
                             {DNNL_ARG_DIFF_WEIGHTS, out},
                             {DNNL_ARG_DIFF_BIAS, Wrap(ctx_, b_md_, db)}});
             });
  ctx_->stream.wait();
}

ReluOp::ReluOp(DnnlContext* ctx, const memory::desc& md) : ctx_(ctx) {
  dnnl::eltwise_forward::desc fd(prop_kind::forward_training,
                                 algorithm::eltwise_relu, md, 0.0f, 0.0f);
  fwd_pd_ = dnnl::eltwise_forward::primitive_desc(fd, ctx->engine);
  fwd_ = dnnl::eltwise_forward(fwd_pd_);
  dnnl::eltwise_backward::desc bd(algorithm::eltwise_relu, md, md, 0.0f, 0.0f);
  bwd_ = dnnl::eltwise_backward(
      dnnl::eltwise_backward::primitive_desc(bd, ctx->engine, fwd_pd_));
}

void ReluOp::Forward(const memory& src, const memory& dst) {
  fwd_.execute(ctx_->stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
  ctx_->stream.wait();
}

void ReluOp::Backward(const memory& src, const memory& diff_dst,
                      const memory& diff_src) {
  bwd_.execute(ctx_->stream, {{DNNL_ARG_SRC, src},
                              {DNNL_ARG_DIFF_DST, diff_dst},
                              {DNNL_ARG_DIFF_SRC, diff_src}});
  ctx_->stream.wait();
}

MaxPoolOp::MaxPoolOp(DnnlContext* ctx, const memory::desc& src_md, int k)
    : ctx_(ctx) {
  const memory::dims s = src_md.dims();
  CHECK_EQ(s.size(), 4u);
  const memory::dims dst_dims{s[0], s[1], s[2] / k, s[3] / k};
  const memory::dims window{k, k}, pad{0, 0};
  dnnl::pooling_forward::desc fd(prop_kind::forward_training,
                                 algorithm::pooling_max, src_md,
                                 AnyDesc(dst_dims), window, window, pad, pad);
  dnnl::pooling_forward::primitive_desc pd(fd, ctx->engine);
  fwd_ = dnnl::pooling_forward(pd);
  dst_md_ = pd.dst_desc();
  workspace_ = memory(pd.workspace_desc(), ctx->engine);
  dnnl::pooling_backward::desc bd(algorithm::pooling_max, src_md, dst_md_,
                                  window, window, pad, pad);
  bwd_ = dnnl::pooling_backward(
      dnnl::pooling_backward::primitive_desc(bd, ctx->engine, pd));
}

void MaxPoolOp::Forward(const memory& src, const memory& dst) {
  fwd_.execute(ctx_->stream, {{DNNL_ARG_SRC, src},
                              {DNNL_ARG_DST, dst},
                              {DNNL_ARG_WORKSPACE, workspace_}});
  ctx_->stream.wait();
}

void MaxPoolOp::Backward(const memory& diff_dst, const memory& diff_src) {
  bwd_.execute(ctx_->stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                              {DNNL_ARG_DIFF_SRC, diff_src},
                              {DNNL_ARG_WORKSPACE, workspace_}});
  ctx_->stream.wait();
}

LinearOp::LinearOp(DnnlContext* ctx, int n, int in, int out)
    : ctx_(ctx),
      x_md_(PlainDesc({n, in})),
      w_md_(PlainDesc({out, in})),
      b_md_(PlainDesc({out})),
      y_md_(PlainDesc({n, out})) {
  dnnl::inner_product_forward::desc fd(prop_kind::forward_training, x_md_,
                                       w_md_, b_md_, y_md_);
  dnnl::inner_product_forward::primitive_desc pd(fd, ctx->engine);
  fwd_ = dnnl::inner_product_forward(pd);
  dnnl::inner_product_backward_data::desc bd(x_md_, w_md_, y_md_);
  bwd_ = dnnl::inner_product_backward_data(
      dnnl::inner_product_backward_data::primitive_desc(bd, ctx->engine, pd));
  dnnl::inner_product_backward_weights::desc wd(x_md_, w_md_, b_md_, y_md_);
  bww_ = dnnl::inner_product_backward_weights(
      dnnl::inner_product_backward_weights::primitive_desc(wd, ctx->engine,
                                                           pd));
}

void LinearOp::Forward(const float* x, const float* w, const float* b,
                       float* y) {
  fwd_.execute(ctx_->stream, {{DNNL_ARG_SRC, Wrap(ctx_, x_md_, x)},
                              {DNNL_ARG_WEIGHTS, Wrap(ctx_, w_md_, w)},
                              {DNNL_ARG_BIAS, Wrap(ctx_, b_md_, b)},
                              {DNNL_ARG_DST, Wrap(ctx_, y_md_, y)}});
  ctx_->stream.wait();
}

void LinearOp::BackwardData(const float* dy, const float* w, float* dx) {
  bwd_.execute(ctx_->stream, {{DNNL_ARG_DIFF_DST, Wrap(ctx_, y_md_, dy)},
                              {DNNL_ARG_WEIGHTS, Wrap(ctx_, w_md_, w)},
                              {DNNL_ARG_DIFF_SRC, Wrap(ctx_, x_md_, dx)}});
  ctx_->stream.wait();
}

void LinearOp::BackwardWeights(const float* x, const float* dy, float* dw,
                               float* db) {
  bww_.execute(ctx_->stream, {{DNNL_ARG_SRC, Wrap(ctx_, x_md_, x)},
                              {DNNL_ARG_DIFF_DST, Wrap(ctx_, y_md_, dy)},
                              {DNNL_ARG_DIFF_WEIGHTS, Wrap(ctx_, w_md_, dw)},
                              {DNNL_ARG_DIFF_BIAS, Wrap(ctx_, b_md_, db)}});
  ctx_->stream.wait();
}

}  // namespace cpu
}  // namespace model
}  // namespace ps
