// FlashParams: everything a flash kernel needs, derived once per call from the
// spec and the tensors (FlashAttention's Flash_fwd_params idea). Kernels read
// only this struct; they never see AttentionSpec or TensorView.
//
// q, k, v, bias, out, dout and the gradients hold `dtype` elements (f32, bf16 or
// f16): kernels are instantiated per element type E and read them through the
// typed accessors below; the LSE and every tile are f32.
#pragma once

#include <cstdint>

#include "attend/backend.h"
#include "kernel/half.h"
#include "kernel/kernel_problem.h"
#include "kernel/layout.h"
#include "kernel/philox.h"
#include "kernel/semantics.h"

namespace attend::flash {

struct FlashParams : detail::KernelProblem {
  bool alibi = false;

  // forward outputs / backward inputs
  void* out = nullptr;
  detail::TokenStrides so;
  float* lse = nullptr;
  detail::TokenStrides slse;

  // backward
  const void* dout = nullptr;
  detail::TokenStrides sdo;
  void *dq = nullptr, *dk = nullptr, *dv_out = nullptr;
  detail::TokenStrides sdq, sdk, sdv;
  // dq is f32 (always for f32 problems; spec.dq_dtype = f32 for bf16/f16): the
  // kernels then accumulate dQ in place there instead of in a scratch sum.
  bool dq_f32 = true;
  // out is f32 for a bf16/f16 problem (spec.out_dtype = f32: a forward partial).
  bool out_f32 = false;
  // spec.accumulate_grads: dq/dk/dv are added to, not overwritten.
  bool accumulate = false;

  // Typed views of the dtype-erased tensors (E must be the element type of `dtype`).
  template <class E> const E* q_as() const { return static_cast<const E*>(q); }
  template <class E> const E* bias_as() const { return static_cast<const E*>(bias); }
  template <class E> E* out_as() const { return static_cast<E*>(out); }
  template <class E> const E* dout_as() const { return static_cast<const E*>(dout); }
  template <class E> E* dq_as() const { return static_cast<E*>(dq); }
  template <class E> E* dk_as() const { return static_cast<E*>(dk); }
  template <class E> E* dv_as() const { return static_cast<E*>(dv_out); }
  // Row `t` (sequence-local) of K / V for kv head hk of sequence b.
  // (Paged: storage row t of sequence b — key index + kv_begin, the left
  // padding — lives in row t % page_size of page block_table[b, t / page_size].)
  template <class E>
  const E* k_row(std::int64_t b, const detail::SeqSpan& s, std::int64_t t, std::int64_t hk) const {
    const E* base = static_cast<const E*>(k);
    if (pages.paged()) return base + pages.offset(sk, b, s.kv_begin + t, hk);
    return base + sk.offset(b, s.kv_begin + t, hk);
  }
  template <class E>
  const E* v_row(std::int64_t b, const detail::SeqSpan& s, std::int64_t t, std::int64_t hk) const {
    const E* base = static_cast<const E*>(v);
    if (pages.paged()) return base + pages.offset(sv, b, s.kv_begin + t, hk);
    return base + sv.offset(b, s.kv_begin + t, hk);
  }
  float slope(std::int64_t b, std::int64_t h) const { return slopes(b, h); }

  // The bf16-GEMM forward's K/V, packed once per call for every task of a
  // (batch, kv head) pair instead of once per task (flash_backend.cpp,
  // forward_bf16_impl.h): pairs b * heads_kv + hk in [packed_first,
  // packed_first + packed_count), packed_words apart, each the pair's first
  // packed_blocks key blocks (DtypeKernels::pack_kv). Null: each task packs
  // the key blocks it reads itself.
  const std::uint32_t* packed_kv = nullptr;
  std::int64_t packed_first = 0, packed_count = 0, packed_words = 0, packed_blocks = 0;
  const std::uint32_t* packed_pair(std::int64_t b, std::int64_t hk) const {
    const std::int64_t i = b * heads_kv + hk - packed_first;
    return packed_kv != nullptr && i >= 0 && i < packed_count ? packed_kv + i * packed_words : nullptr;
  }
};

// One backward task: the query heads [g_begin, g_end) of the GQA group of
// (batch b, kv head hk). A task of the whole group stores dK/dV itself
// (kv_part null). When the group is split over several tasks (too few (b, hk)
// pairs to occupy the threads, flash_backend.cpp), each writes its f32 share
// of dK/dV to kv_part — seqlen_kv rows of dqk floats (dK), then seqlen_kv rows
// of dv floats (dV) — and store_kv_parts stores the sum of the shares.
struct BackwardTask {
  std::int64_t b = 0, hk = 0;
  std::int64_t g_begin = 0, g_end = 0;
  float* kv_part = nullptr;
};

// Writes one output row: acc[d] * inv in the output's dtype (E, or f32 for a
// partial); an empty row is 0 whatever its accumulator met.
template <class E>
inline void store_out_row(const FlashParams& p, std::int64_t offset, const float* acc, float inv, bool empty) {
  if (p.out_f32) {
    float* dst = p.out_as<float>() + offset;
    for (std::int64_t d = 0; d < p.dv; ++d) dst[d] = empty ? 0.0f : acc[d] * inv;
  } else {
    E* dst = p.out_as<E>() + offset;
    for (std::int64_t d = 0; d < p.dv; ++d) dst[d] = detail::from_f32<E>(empty ? 0.0f : acc[d] * inv);
  }
}

FlashParams make_forward_params(const ForwardArgs& args);
FlashParams make_backward_params(const BackwardArgs& args);

}  // namespace attend::flash
