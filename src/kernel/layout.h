// Layout-independent addressing. Backends see every q/k/v/out-shaped tensor as
// rows of one (sequence, token, head) with a contiguous head_dim, and LSE as one
// float per (sequence, head, query row), whatever the user's layout.
#pragma once

#include <cstdint>

#include "attend/backend.h"
#include "attend/spec.h"
#include "attend/tensor.h"
#include "kernel/hd.h"

namespace attend::detail {

// Element strides of a (b, s, h, :) tensor. For thd, b is 0 and s indexes the
// packed token dimension (sequences are located through cu_seqlens).
struct TokenStrides {
  std::int64_t b = 0, s = 0, h = 0;
  ATTEND_HD std::int64_t offset(std::int64_t b_, std::int64_t token, std::int64_t h_) const {
    return b_ * b + token * s + h_ * h;
  }
};
TokenStrides token_strides(const TensorView& t, Layout layout);

// Strides of an LSE tensor: dense (B,H,Sq) or varlen (H,total_q), same rule.
TokenStrides lse_strides(const TensorView& lse, Layout layout);

// Where sequence b lives: its first packed row (0 for dense layouts) and length.
// Paged K/V: kv_begin = cache_leftpad[b] (or 0), kv_len = cache_seqlens[b] - kv_begin.
struct SeqSpan {
  std::int64_t q_begin = 0, q_len = 0, kv_begin = 0, kv_len = 0;
};
SeqSpan sequence_span(const AttentionSpec& spec, const Inputs& in, std::int64_t b);

// The same lookup as plain kernel parameters: pointers to the (validated)
// cu_seqlens or cache lengths and their strides, no pointer into the API.
struct SeqLocator {
  std::int64_t seqlen_q = 0, seqlen_kv = 0;
  const std::int32_t *cu_q = nullptr, *cu_kv = nullptr;  // varlen
  std::int64_t cu_q_stride = 1, cu_kv_stride = 1;
  const std::int32_t *cache_end = nullptr, *cache_begin = nullptr;  // paged (begin: leftpad, optional)
  std::int64_t cache_end_stride = 1, cache_begin_stride = 1;

  ATTEND_HD SeqSpan operator()(std::int64_t b) const {
    if (cache_end) {
      const std::int64_t end = cache_end[b * cache_end_stride];
      const std::int64_t begin = cache_begin ? cache_begin[b * cache_begin_stride] : 0;
      return {0, seqlen_q, begin, end - begin};
    }
    if (!cu_q) return {0, seqlen_q, 0, seqlen_kv};
    const std::int64_t q0 = cu_q[b * cu_q_stride], k0 = cu_kv[b * cu_kv_stride];
    return {q0, cu_q[(b + 1) * cu_q_stride] - q0, k0, cu_kv[(b + 1) * cu_kv_stride] - k0};
  }
};
SeqLocator seq_locator(const AttentionSpec& spec, const Inputs& in);

// ALiBi slopes as kernel parameters: (H) or (B, H) f32 (b stride 0 for (H)).
struct AlibiSlopes {
  const float* data = nullptr;  // null: no ALiBi
  std::int64_t b_stride = 0, h_stride = 1;
  ATTEND_HD float operator()(std::int64_t b, std::int64_t h) const {
    return data ? data[b * b_stride + h * h_stride] : 0.0f;
  }
};
AlibiSlopes alibi_slopes(const AttentionSpec& spec, const Inputs& in);

// Paged K/V (spec.kv_page_size > 0): storage row t of sequence b (t counts from
// the start of its block-table row, i.e. kv_begin + key index) is row
// t % page_size of page table[b, t / page_size]. Pool strides: `b` between pages,
// `s` between rows of a page, `h` between heads. Null table: not paged.
struct PageTable {
  const std::int32_t* table = nullptr;
  std::int64_t row_stride = 0, col_stride = 1, page_size = 0;
  bool paged() const { return table != nullptr; }
  std::int64_t offset(const TokenStrides& pool, std::int64_t b, std::int64_t t, std::int64_t h) const {
    const std::int64_t page = table[b * row_stride + (t / page_size) * col_stride];
    return page * pool.b + (t % page_size) * pool.s + h * pool.h;
  }
};
PageTable page_table(const AttentionSpec& spec, const Inputs& in);
// Strides of a (pages, page_size, heads, dim) pool as TokenStrides {page, row, head}.
TokenStrides pool_strides(const TensorView& pool);

// The scales of an 8-bit K/V (AttentionSpec::kv_scale) as kernel parameters:
// the scale of storage row `row` of sequence b (kv_begin included, as for
// PageTable) and kv head hk. A per-head scale has a row stride of 0, a
// per-tensor one all strides 0; null data: every scale is 1.
struct KVScaleView {
  const float* data = nullptr;
  TokenStrides st;     // {b (paged: page), row, head}
  bool paged = false;  // per-token scales of a paged cache: pages like K's
  float at(const PageTable& pages, std::int64_t b, std::int64_t row, std::int64_t hk) const {
    if (!data) return 1.0f;
    return data[paged ? pages.offset(st, b, row, hk) : st.offset(b, row, hk)];
  }
};
KVScaleView kv_scale_view(const AttentionSpec& spec, const TensorView& scale);

// Strides of the bias (or dbias) tensor (Bb, Hb, Sq, Sk); a broadcast dim has stride 0.
struct BiasStrides {
  std::int64_t b = 0, h = 0, i = 0;
  ATTEND_HD std::int64_t offset(std::int64_t b_, std::int64_t h_, std::int64_t i_) const {
    return b_ * b + h_ * h + i_ * i;
  }
};
BiasStrides bias_strides(const TensorView& bias);

// ALiBi slope of (b, h); 0 when spec.alibi is off.
double alibi_slope(const AttentionSpec& spec, const Inputs& in, std::int64_t b, std::int64_t h);

}  // namespace attend::detail
