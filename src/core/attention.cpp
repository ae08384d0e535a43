#include "attend/attention.h"

#include <span>
#include <string>

#include "attend/error.h"
#include "core/select_cache.h"

namespace attend {

namespace {

// out has q's layout with head_dim_v; LSE is (B,H,Sq) or (H,total_q).
Tensor make_out(const AttentionSpec& s) {
  switch (s.layout) {
    case Layout::bshd: return Tensor::zeros(s.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim_v});
    case Layout::bhsd: return Tensor::zeros(s.dtype, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
    case Layout::sbhd: return Tensor::zeros(s.dtype, {s.seqlen_q, s.batch, s.heads_q, s.head_dim_v});
    case Layout::thd: return Tensor::zeros(s.dtype, {s.total_q, s.heads_q, s.head_dim_v});
  }
  return {};
}

Tensor make_lse(const AttentionSpec& s) {
  const DType dt = s.dtype == DType::f64 ? DType::f64 : DType::f32;
  return s.varlen() ? Tensor::zeros(dt, {s.heads_q, s.total_q}) : Tensor::zeros(dt, {s.batch, s.heads_q, s.seqlen_q});
}

}  // namespace

ForwardResult forward(const Inputs& inputs, const AttentionSpec& spec, Mode mode, const Policy* policy) {
  validate_inputs(spec, inputs);  // shape errors first: they are the caller's to fix
  ForwardResult r;
  r.ctx.selection_ = detail::select_shared(spec, mode, policy ? *policy : current_policy());
  r.out = make_out(spec);
  r.lse = make_lse(spec);
  r.ctx.selection_->backend->forward(ForwardArgs{spec, inputs, r.out, r.lse});
  r.ctx.spec_ = spec;
  r.ctx.mode_ = mode;
  r.ctx.inputs_ = inputs;
  r.ctx.out_ = r.out;
  r.ctx.lse_ = r.lse;
  return r;
}

ForwardResult forward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const AttentionSpec& spec, Mode mode) {
  Inputs in;
  in.q = q;
  in.k = k;
  in.v = v;
  return forward(in, spec, mode);
}

Gradients backward(const Context& ctx, const TensorView& dout) {
  if (!ctx.valid()) {
    throw Error(ErrorCode::bad_state, "context", "empty", "backward needs the context returned by forward()");
  }
  if (ctx.mode_ != Mode::training) {
    throw Error(ErrorCode::bad_state, "context.mode", "inference",
                "backward needs a context from Mode::training: an inference selection never checked "
                "that backend '" + std::string(ctx.backend().name()) + "' has a backward for this problem");
  }
  const AttentionSpec& s = ctx.spec_;
  Gradients g;
  const TensorView& q = ctx.inputs_.q;
  g.dq = Tensor::zeros(s.effective_dq_dtype(), std::span<const std::int64_t>(q.shape.data(), static_cast<std::size_t>(q.ndim)));
  g.dk = Tensor::zeros_like(ctx.inputs_.k);
  g.dv = Tensor::zeros_like(ctx.inputs_.v);
  if (s.bias_requires_grad) g.dbias = Tensor::zeros_like(ctx.inputs_.bias);
  // Always the backend forward ran on.
  ctx.backend().backward(BackwardArgs{s, ctx.inputs_, ctx.out_, ctx.lse_, dout, g.dq, g.dk, g.dv, g.dbias});
  return g;
}

}  // namespace attend
