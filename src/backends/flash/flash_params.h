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

  detail::SeqSpan span(std::int64_t b) const { return detail::sequence_span(*spec, *in, b); }
  detail::KeyRange keys(std::int64_t i, const detail::SeqSpan& s) const {
    return detail::visible_keys(*spec, i, s.q_len, s.kv_len);
  }
  float slope(std::int64_t b, std::int64_t h) const {
    return static_cast<float>(detail::alibi_slope(*spec, *in, b, h));
  }
};

FlashParams make_forward_params(const ForwardArgs& args);
FlashParams make_backward_params(const BackwardArgs& args);

}  // namespace attend::flash
