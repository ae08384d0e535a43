// Layout-independent addressing. Backends see every q/k/v/out-shaped tensor as
// rows of one (sequence, token, head) with a contiguous head_dim, and LSE as one
// float per (sequence, head, query row), whatever the user's layout.
#pragma once

#include <cstdint>

#include "attend/backend.h"
#include "attend/spec.h"
#include "attend/tensor.h"

namespace attend::detail {

// Element strides of a (b, s, h, :) tensor. For thd, b is 0 and s indexes the
// packed token dimension (sequences are located through cu_seqlens).
struct TokenStrides {
  std::int64_t b = 0, s = 0, h = 0;
  std::int64_t offset(std::int64_t b_, std::int64_t token, std::int64_t h_) const {
    return b_ * b + token * s + h_ * h;
  }
};
TokenStrides token_strides(const TensorView& t, Layout layout);

// Strides of an LSE tensor: dense (B,H,Sq) or varlen (H,total_q), same rule.
TokenStrides lse_strides(const TensorView& lse, Layout layout);

// Where sequence b lives: its first packed row (0 for dense layouts) and length.
struct SeqSpan {
  std::int64_t q_begin = 0, q_len = 0, kv_begin = 0, kv_len = 0;
};
SeqSpan sequence_span(const AttentionSpec& spec, const Inputs& in, std::int64_t b);

// Strides of the bias (or dbias) tensor (Bb, Hb, Sq, Sk); a broadcast dim has stride 0.
struct BiasStrides {
  std::int64_t b = 0, h = 0, i = 0;
  std::int64_t offset(std::int64_t b_, std::int64_t h_, std::int64_t i_) const {
    return b_ * b + h_ * h + i_ * i;
  }
};
BiasStrides bias_strides(const TensorView& bias);

// ALiBi slope of (b, h); 0 when spec.alibi is off.
double alibi_slope(const AttentionSpec& spec, const Inputs& in, std::int64_t b, std::int64_t h);

}  // namespace attend::detail
