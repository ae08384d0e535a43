#include "backends/flash/flash_params.h"

namespace attend::flash {

namespace {

FlashParams common(const AttentionSpec& s, const Inputs& in) {
  FlashParams p;
  p.spec = &s;
  p.in = &in;
  p.batch = s.batch;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.group = s.group_size();
  p.dqk = s.head_dim_qk;
  p.dv = s.head_dim_v;
  p.scale = static_cast<float>(s.effective_scale());
  p.softcap = static_cast<float>(s.softcap);
  p.masked = s.is_masked();
  p.dtype = s.dtype;
  p.q = in.q.data;
  p.k = in.k.data;
  p.v = in.v.data;
  p.sq = detail::token_strides(in.q, s.layout);
  p.sk = detail::token_strides(in.k, s.layout);
  p.sv = detail::token_strides(in.v, s.layout);
  if (s.has_bias) {
    p.bias = in.bias.data;
    p.sbias = detail::bias_strides(in.bias);
  }
  if (s.paged()) {  // k/v are page pools: rows and heads inside a page, pages apart
    const detail::PageTable pt = detail::page_table(s, in);
    p.block_table = pt.table;
    p.block_table_stride = pt.row_stride;
    p.page_size = pt.page_size;
    p.sk = detail::pool_strides(in.k);
    p.sv = detail::pool_strides(in.v);
    p.page_stride_k = p.sk.b;
    p.page_stride_v = p.sv.b;
  }
  p.alibi = s.alibi;
  if (s.dropout_p > 0) {
    p.dropout = true;
    p.dropout_mask = detail::DropoutMask::make(s.dropout_seed, s.dropout_p);
    p.dropout_scale = static_cast<float>(1.0 / (1.0 - s.dropout_p));
  }
  return p;
}

}  // namespace

FlashParams make_forward_params(const ForwardArgs& a) {
  FlashParams p = common(a.spec, a.in);
  p.out = a.out.data;
  p.so = detail::token_strides(a.out, a.spec.layout);
  p.lse = a.lse.as<float>();
  p.slse = detail::lse_strides(a.lse, a.spec.layout);
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
  p.dk = a.dk.data;
  p.dv_out = a.dv.data;
  p.sdq = detail::token_strides(a.dq, a.spec.layout);
  p.sdk = detail::token_strides(a.dk, a.spec.layout);
  p.sdv = detail::token_strides(a.dv, a.spec.layout);
  return p;
}

}  // namespace attend::flash
