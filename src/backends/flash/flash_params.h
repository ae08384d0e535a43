// FlashParams: everything a flash kernel needs, derived once per call from the
// spec and the tensors (FlashAttention's Flash_fwd_params idea). Kernels read
// only this struct; they never see AttentionSpec or TensorView.
#pragma once

#include <cstdint>

#include "attend/backend.h"
#include "core/layout.h"
#include "core/philox.h"
#include "core/semantics.h"

namespace attend::flash {

struct FlashParams {
  // sizes
  std::int64_t batch = 0, heads_q = 0, heads_kv = 0, group = 1, dqk = 0, dv = 0;
  // logits: s = scale * q.k; softcap > 0: s = softcap * tanh(s / softcap)
  float scale = 1.0f, softcap = 0.0f;
  // the spec (for visible_keys) and the inputs (for sequence spans, ALiBi)
  const AttentionSpec* spec = nullptr;
  const Inputs* in = nullptr;
  bool masked = false;

  const float *q = nullptr, *k = nullptr, *v = nullptr;
  detail::TokenStrides sq, sk, sv;
  const float* bias = nullptr;
  detail::BiasStrides sbias;
  bool alibi = false;

  // forward outputs / backward inputs
  float* out = nullptr;
  detail::TokenStrides so;
  float* lse = nullptr;
  detail::TokenStrides slse;

  // backward
  const float* dout = nullptr;
  detail::TokenStrides sdo;
  float *dq = nullptr, *dk = nullptr, *dv_out = nullptr;
  detail::TokenStrides sdq, sdk, sdv;

  // dropout: keep mask from the shared Philox function, kept values * dropout_scale
  bool dropout = false;
  detail::DropoutMask dropout_mask;
  float dropout_scale = 1.0f;

  // Paged K/V (a KV cache): storage row t of sequence b (key index + kv_begin,
  // the left padding) lives in page block_table[b * block_table_stride + t / page_size],
  // row t % page_size of k/v tensors shaped (pages, page_size, heads_kv, dim).
  // Null: dense/varlen.
  const std::int32_t* block_table = nullptr;
  std::int64_t block_table_stride = 0, page_size = 0;
  std::int64_t page_stride_k = 0, page_stride_v = 0;  // floats between pages

  detail::SeqSpan span(std::int64_t b) const { return detail::sequence_span(*spec, *in, b); }
  // Row `t` (sequence-local) of K / V for kv head hk of sequence b.
  const float* k_row(std::int64_t b, const detail::SeqSpan& s, std::int64_t t, std::int64_t hk) const {
    if (block_table) return k + paged_offset(b, s.kv_begin + t, page_stride_k, sk, hk);
    return k + sk.offset(b, s.kv_begin + t, hk);
  }
  const float* v_row(std::int64_t b, const detail::SeqSpan& s, std::int64_t t, std::int64_t hk) const {
    if (block_table) return v + paged_offset(b, s.kv_begin + t, page_stride_v, sv, hk);
    return v + sv.offset(b, s.kv_begin + t, hk);
  }
  std::int64_t paged_offset(std::int64_t b, std::int64_t t, std::int64_t page_stride, const detail::TokenStrides& st,
                            std::int64_t hk) const {
    const std::int64_t page = block_table[b * block_table_stride + t / page_size];
    return page * page_stride + (t % page_size) * st.s + hk * st.h;
  }
  detail::KeyRange keys(std::int64_t i, const detail::SeqSpan& s) const {
    return detail::visible_keys(*spec, i, s.q_len, s.kv_len);
  }
  detail::KeyRange queries(std::int64_t j, const detail::SeqSpan& s) const {
    return detail::visible_queries(*spec, j, s.q_len, s.kv_len);
  }
  float slope(std::int64_t b, std::int64_t h) const {
    return static_cast<float>(detail::alibi_slope(*spec, *in, b, h));
  }
};

FlashParams make_forward_params(const ForwardArgs& args);
FlashParams make_backward_params(const BackwardArgs& args);

}  // namespace attend::flash
