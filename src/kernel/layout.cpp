#include "kernel/layout.h"

namespace attend::detail {

TokenStrides token_strides(const TensorView& t, Layout layout) {
  switch (layout) {
    case Layout::bshd: return {t.strides[0], t.strides[1], t.strides[2]};
    case Layout::bhsd: return {t.strides[0], t.strides[2], t.strides[1]};
    case Layout::sbhd: return {t.strides[1], t.strides[0], t.strides[2]};
    case Layout::thd: return {0, t.strides[0], t.strides[1]};
  }
  return {};
}

TokenStrides lse_strides(const TensorView& lse, Layout layout) {
  // Dense LSE is (B, H, Sq); varlen is (H, total_q) indexed by the packed row.
  if (layout == Layout::thd) return {0, lse.strides[1], lse.strides[0]};
  return {lse.strides[0], lse.strides[2], lse.strides[1]};
}

// The kernels' SeqLocator is the one definition of where a sequence lives.
SeqSpan sequence_span(const AttentionSpec& spec, const Inputs& in, std::int64_t b) { return seq_locator(spec, in)(b); }

SeqLocator seq_locator(const AttentionSpec& spec, const Inputs& in) {
  SeqLocator l;
  l.seqlen_q = spec.seqlen_q;
  l.seqlen_kv = spec.seqlen_kv;
  if (spec.paged()) {
    l.cache_end = in.cache_seqlens.as<const std::int32_t>();
    l.cache_end_stride = in.cache_seqlens.strides[0];
    if (spec.kv_leftpad) {
      l.cache_begin = in.cache_leftpad.as<const std::int32_t>();
      l.cache_begin_stride = in.cache_leftpad.strides[0];
    }
  } else if (spec.varlen()) {
    l.cu_q = in.cu_seqlens_q.as<const std::int32_t>();
    l.cu_kv = in.cu_seqlens_kv.as<const std::int32_t>();
    l.cu_q_stride = in.cu_seqlens_q.strides[0];
    l.cu_kv_stride = in.cu_seqlens_kv.strides[0];
  }
  return l;
}

AlibiSlopes alibi_slopes(const AttentionSpec& spec, const Inputs& in) {
  if (!spec.alibi) return {};
  const TensorView& a = in.alibi_slopes;
  if (a.ndim == 2) return {a.as<const float>(), a.strides[0], a.strides[1]};
  return {a.as<const float>(), 0, a.strides[0]};
}

PageTable page_table(const AttentionSpec& spec, const Inputs& in) {
  if (!spec.paged()) return {};
  const TensorView& bt = in.block_table;
  return {bt.as<const std::int32_t>(), bt.strides[0], bt.strides[1], spec.kv_page_size};
}

TokenStrides pool_strides(const TensorView& pool) { return {pool.strides[0], pool.strides[1], pool.strides[2]}; }

BiasStrides bias_strides(const TensorView& bias) {
  return {bias.shape[0] == 1 ? 0 : bias.strides[0], bias.shape[1] == 1 ? 0 : bias.strides[1], bias.strides[2]};
}

double alibi_slope(const AttentionSpec& spec, const Inputs& in, std::int64_t b, std::int64_t h) {
  return alibi_slopes(spec, in)(b, h);
}

KVScaleView kv_scale_view(const AttentionSpec& spec, const TensorView& scale) {
  KVScaleView v;
  if (spec.kv_scale == KVScale::none || !scale.defined()) return v;
  v.data = scale.as<const float>();
  switch (spec.kv_scale) {
    case KVScale::none: break;
    case KVScale::per_tensor: v.st = {0, 0, 0}; break;
    case KVScale::per_head: v.st = {scale.strides[0], 0, scale.strides[1]}; break;
    case KVScale::per_token:
      v.paged = spec.paged();
      v.st = spec.paged() ? TokenStrides{scale.strides[0], scale.strides[1], scale.strides[2]}
                          : token_strides(scale, spec.layout);
      break;
  }
  return v;
}

}  // namespace attend::detail
