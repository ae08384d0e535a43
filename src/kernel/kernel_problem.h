// The part of a fused kernel's parameters that flash and decode derive the same
// way from a spec and its inputs: sizes, the f32 logit terms, the tensors with
// their strides (paged K/V included) and the dropout mask. FlashParams and
// DecodeParams extend it with what only their kernels need.
#pragma once

#include <cstdint>

#include "attend/backend.h"
#include "kernel/layout.h"
#include "kernel/philox.h"
#include "kernel/semantics.h"
#include "kernel/softmax_sink.h"

namespace attend::detail {

// Plain values, pointers and strides only: a device kernel could take it by
// value (FlashAttention's Flash_fwd_params idea), nothing points back into the
// API objects it was made from.
struct KernelProblem {
  std::int64_t batch = 0, heads_q = 0, heads_kv = 0, group = 1, dqk = 0, dv = 0;
  std::int64_t seqlen_q = 0, seqlen_kv = 0;  // varlen/paged: the maxima
  // logits: s = scale * q.k; softcap > 0: s = softcap * tanh(s / softcap). Both
  // fit f32: the backends' checks decline what does not (kernel/f32_range.h).
  float scale = 1.0f, softcap = 0.0f;
  MaskRule mask;        // windows and the partial problem's offsets
  bool masked = false;  // some window side is bounded
  SeqLocator seqs;      // where sequence b's queries and keys are
  AlibiSlopes slopes;   // slopes.data null: no ALiBi
  SinkLogits sinks;     // softmax_type: the sink logit of each query head

  SeqSpan span(std::int64_t b) const { return seqs(b); }
  KeyRange keys(std::int64_t i, const SeqSpan& s) const { return visible_keys(mask, i, s.q_len, s.kv_len); }
  KeyRange queries(std::int64_t j, const SeqSpan& s) const { return visible_queries(mask, j, s.q_len, s.kv_len); }
  // Row i's diagonal minus key 0's position: ALiBi's distance to key j is |shift + i - j|.
  std::int64_t alibi_shift(const SeqSpan& s) const { return diagonal(mask, 0, s.q_len, s.kv_len); }

  // Element type of q, k, v, bias and out (f32, bf16 or f16); the kernels are
  // instantiated per type and read the tensors through typed casts.
  DType dtype = DType::f32;
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  TokenStrides sq, sk, sv;  // paged: sk/sv are the pools' {page, row, head} strides
  PageTable pages;          // paged K/V (a KV cache); pages.paged() is false otherwise
  // Element type of k and v: dtype, or an 8-bit code type whose element is
  // code * scale (kscale for K, vscale for V; AttentionSpec::kv_scale).
  DType kv_dtype = DType::f32;
  KVScaleView kscale, vscale;
  const void* bias = nullptr;
  BiasStrides sbias;

  // dropout: keep mask from the shared Philox function, kept values * dropout_scale,
  // drawn at the global position (mask.q_offset + i, mask.kv_offset + j)
  bool dropout = false;
  DropoutMask dropout_mask;
  float dropout_scale = 1.0f;
};

// Fills every field above from a validated spec and its inputs.
void init_kernel_problem(KernelProblem& p, const AttentionSpec& spec, const Inputs& in);

}  // namespace attend::detail
