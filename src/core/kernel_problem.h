// The part of a fused kernel's parameters that flash and decode derive the same
// way from a spec and its inputs: sizes, the f32 logit terms, the tensors with
// their strides (paged K/V included) and the dropout mask. FlashParams and
// DecodeParams extend it with what only their kernels need.
#pragma once

#include <cstdint>

#include "attend/backend.h"
#include "core/layout.h"
#include "core/philox.h"

namespace attend::detail {

struct KernelProblem {
  std::int64_t batch = 0, heads_q = 0, heads_kv = 0, group = 1, dqk = 0, dv = 0;
  // logits: s = scale * q.k; softcap > 0: s = softcap * tanh(s / softcap). Both
  // fit f32: the backends' checks decline what does not (core/f32_range.h).
  float scale = 1.0f, softcap = 0.0f;
  const AttentionSpec* spec = nullptr;

  // Element type of q, k, v, bias and out (f32, bf16 or f16); the kernels are
  // instantiated per type and read the tensors through typed casts.
  DType dtype = DType::f32;
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  TokenStrides sq, sk, sv;  // paged: sk/sv are the pools' {page, row, head} strides
  PageTable pages;          // paged K/V (a KV cache); pages.paged() is false otherwise
  const void* bias = nullptr;
  BiasStrides sbias;

  // dropout: keep mask from the shared Philox function, kept values * dropout_scale
  bool dropout = false;
  DropoutMask dropout_mask;
  float dropout_scale = 1.0f;
};

// Fills every field above from a validated spec and its inputs.
void init_kernel_problem(KernelProblem& p, const AttentionSpec& spec, const Inputs& in);

}  // namespace attend::detail
