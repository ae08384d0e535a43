#include "backends/flash/flash_params.h"

namespace attend::flash {

namespace {

FlashParams common(const AttentionSpec& s, const Inputs& in) {
  FlashParams p;
  detail::init_kernel_problem(p, s, in);
  p.alibi = s.alibi;
  return p;
}

}  // namespace

FlashParams make_forward_params(const ForwardArgs& a) {
  FlashParams p = common(a.spec, a.in);
  p.out = a.out.data;
  p.so = detail::token_strides(a.out, a.spec.layout);
  p.lse = a.lse.as<float>();
  p.slse = detail::lse_strides(a.lse, a.spec.layout);
  p.out_f32 = a.spec.dtype != DType::f32 && a.spec.effective_out_dtype() == DType::f32;
  return p;
}

FlashParams make_backward_params(const BackwardArgs& a) {
  FlashParams p = common(a.spec, a.in);
  p.out = a.out.data;
  p.so = detail::token_strides(a.out, a.spec.layout);
  p.lse = a.lse.as<float>();
  p.slse = detail::lse_strides(a.lse, a.spec.layout);
  p.dout = a.dout.data;
  p.sdo = detail::token_strides(a.dout, a.spec.layout);
  p.dq = a.dq.data;
  p.dq_f32 = a.spec.effective_dq_dtype() == DType::f32;
  p.accumulate = a.spec.accumulate_grads;
  p.dk = a.dk.data;
  p.dv_out = a.dv.data;
  p.sdq = detail::token_strides(a.dq, a.spec.layout);
  p.sdk = detail::token_strides(a.dk, a.spec.layout);
  p.sdv = detail::token_strides(a.dv, a.spec.layout);
  return p;
}

}  // namespace attend::flash
