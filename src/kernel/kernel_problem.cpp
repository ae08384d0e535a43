#include "kernel/kernel_problem.h"

namespace attend::detail {

void init_kernel_problem(KernelProblem& p, const AttentionSpec& s, const Inputs& in) {
  p.batch = s.batch;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.group = s.group_size();
  p.dqk = s.head_dim_qk;
  p.dv = s.head_dim_v;
  p.scale = static_cast<float>(s.effective_scale());
  p.softcap = static_cast<float>(s.softcap);
  p.seqlen_q = s.seqlen_q;
  p.seqlen_kv = s.seqlen_kv;
  p.mask = mask_rule(s);
  p.masked = s.is_masked();
  p.seqs = seq_locator(s, in);
  p.slopes = alibi_slopes(s, in);
  p.sinks.type = s.softmax_type;
  if (s.softmax_type == SoftmaxType::learnable) p.sinks.logits = in.sinks.as<const float>();
  p.dtype = s.dtype;
  p.q = in.q.data;
  p.k = in.k.data;
  p.v = in.v.data;
  p.sq = token_strides(in.q, s.layout);
  if (s.paged()) {
    p.pages = page_table(s, in);
    p.sk = pool_strides(in.k);
    p.sv = pool_strides(in.v);
  } else {
    p.sk = token_strides(in.k, s.layout);
    p.sv = token_strides(in.v, s.layout);
  }
  p.kv_dtype = s.effective_kv_dtype();
  p.kscale = kv_scale_view(s, in.k_scale);
  p.vscale = kv_scale_view(s, in.v_scale);
  if (s.has_bias) {
    p.bias = in.bias.data;
    p.sbias = bias_strides(in.bias);
  }
  if (s.dropout_p > 0) {
    p.dropout = true;
    p.dropout_mask = DropoutMask::make(s.dropout_seed, s.dropout_p);
    p.dropout_scale = static_cast<float>(1.0 / (1.0 - s.dropout_p));
  }
}

}  // namespace attend::detail
