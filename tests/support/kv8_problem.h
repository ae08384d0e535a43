// Test helpers for 8-bit K/V (AttentionSpec::kv_dtype): a problem's f32 K/V
// quantized to codes with scales in any KVScale layout, and the same problem
// in f64 on the dequantized values (code * scale, exact in f64) — the
// independent reference every 8-bit kernel is held to.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "attend/attend.h"
#include "kernel/quant8.h"
#include "support/half_baseline.h"
#include "support/tensors.h"

namespace attend::testing {

// The double a code stands for (before its scale).
inline double code_value(const TensorView& t, std::int64_t i) {
  switch (t.dtype) {
    case DType::fp8_e4m3: return detail::fp8_e4m3_bits_to_f32(t.as<const std::uint8_t>()[i]);
    case DType::fp8_e5m2: return detail::fp8_e5m2_bits_to_f32(t.as<const std::uint8_t>()[i]);
    case DType::i8: return t.as<const std::int8_t>()[i];
    default: return element(t, i);
  }
}

inline float kv_code_max(DType kv) {
  return kv == DType::fp8_e4m3 ? detail::kFp8E4m3Max : kv == DType::fp8_e5m2 ? detail::kFp8E5m2Max : detail::kInt8Max;
}

inline void set_code(const TensorView& t, std::int64_t i, float x, float scale) {
  switch (t.dtype) {
    case DType::fp8_e4m3: t.as<detail::fp8_e4m3_t>()[i] = detail::quantize<detail::fp8_e4m3_t>(x, scale); return;
    case DType::fp8_e5m2: t.as<detail::fp8_e5m2_t>()[i] = detail::quantize<detail::fp8_e5m2_t>(x, scale); return;
    default: t.as<std::int8_t>()[i] = detail::quantize<std::int8_t>(x, scale); return;
  }
}

// The sequence that owns element row (i0, i1, i2) of a K/V tensor (contiguous,
// 4-d, or thd 3-d) of problem `s`, and its kv head. Paged pools: the sequence
// whose block-table row lists the page (0 for a spare page, which nothing reads).
struct Owner {
  std::int64_t b = 0, h = 0;
};
inline Owner owner_of(const AttentionSpec& s, const Inputs& in, const std::int64_t* idx) {
  if (s.paged()) {
    const TensorView& bt = in.block_table;
    for (std::int64_t b = 0; b < bt.shape[0]; ++b)
      for (std::int64_t w = 0; w < bt.shape[1]; ++w)
        if (bt.as<const std::int32_t>()[b * bt.strides[0] + w * bt.strides[1]] == idx[0]) return {b, idx[2]};
    return {0, idx[2]};
  }
  switch (s.layout) {
    case Layout::bshd: return {idx[0], idx[2]};
    case Layout::bhsd: return {idx[0], idx[1]};
    case Layout::sbhd: return {idx[1], idx[2]};
    case Layout::thd: {
      const auto* cu = in.cu_seqlens_kv.as<const std::int32_t>();
      std::int64_t b = 0;
      while (b + 1 < s.batch && cu[b + 1] <= idx[0]) ++b;
      return {b, idx[1]};
    }
  }
  return {};
}

struct Kv8Problem {
  Problem q8;      // q in the query dtype, k/v codes, scales
  Problem f64;     // q (the query dtype's values) and code * scale in f64
  Problem narrow;  // the dequantized K/V rounded to the query dtype: a naive same-precision run's inputs
  Tensor k_scale, v_scale;
};

// Quantizes `p` (an f32 problem; dense, varlen or paged through `inputs`) to
// kv dtype `kv` with `layout` scales, its queries in `qdtype`. Scales are drawn
// around 2.5 / code max (codes spread over the range), times [0.5, 2).
inline Kv8Problem quantize_problem(const Problem& p, DType qdtype, DType kv, KVScale layout, std::uint64_t seed) {
  Kv8Problem r;
  AttentionSpec s = p.spec;
  s.dtype = qdtype;
  s.kv_dtype = kv;
  s.kv_scale = layout;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  const float base = 2.5f / kv_code_max(kv);
  const auto draw_scales = [&](Tensor& t, const TensorView& kview) {
    const Shape sh = expected_shape(s, Role::k_scale);
    std::vector<std::int64_t> dims(sh.dims, sh.dims + sh.ndim);
    if (layout == KVScale::per_token && s.paged()) dims[0] = kview.shape[0];
    if (layout == KVScale::none) return;
    t = Tensor::zeros(DType::f32, dims);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = base * u(rng);
  };
  draw_scales(r.k_scale, p.inputs.k);
  draw_scales(r.v_scale, p.inputs.v);
  // Codes, and code * scale in f64 and in the query dtype.
  const auto quantize = [&](const TensorView& src, const Tensor& scales, Tensor& codes, Tensor& deq64, Tensor& deqq) {
    TensorView cv = src;
    cv.dtype = kv;
    codes = Tensor::zeros_like(cv);
    cv.dtype = DType::f64;
    deq64 = Tensor::zeros_like(cv);
    cv.dtype = qdtype;
    deqq = Tensor::zeros_like(cv);
    const std::int64_t d = src.shape[src.ndim - 1], rows = src.numel() / d;
    std::vector<std::int64_t> idx(static_cast<std::size_t>(src.ndim), 0);
    for (std::int64_t row = 0; row < rows; ++row) {
      std::int64_t rem = row;
      for (int a = src.ndim - 2; a >= 0; --a) {
        idx[a] = rem % src.shape[a];
        rem /= src.shape[a];
      }
      float scale = 1.0f;
      if (layout == KVScale::per_tensor) scale = scales.as<float>()[0];
      if (layout == KVScale::per_head) {
        const Owner o = owner_of(s, p.inputs, idx.data());
        scale = scales.as<float>()[o.b * s.heads_kv + o.h];
      }
      if (layout == KVScale::per_token) scale = scales.as<float>()[row];
      for (std::int64_t c = 0; c < d; ++c) {
        const std::int64_t i = row * d + c;
        set_code(codes, i, static_cast<float>(element(src, i)), scale);
        const double x = code_value(codes, i) * static_cast<double>(scale);
        deq64.as<double>()[i] = x;
        set_element(deqq, i, x);
      }
    }
  };
  Tensor kc, vc, k64, v64, kq, vq;
  quantize(p.inputs.k, r.k_scale, kc, k64, kq);
  quantize(p.inputs.v, r.v_scale, vc, v64, vq);

  r.q8 = p;
  r.q8.spec = s;
  r.q8.q = convert(p.q, qdtype);
  r.q8.bias = convert(p.bias, qdtype);
  r.q8.k = kc;
  r.q8.v = vc;
  r.q8.inputs.q = r.q8.q;
  r.q8.inputs.k = kc;
  r.q8.inputs.v = vc;
  if (r.q8.bias.defined()) r.q8.inputs.bias = r.q8.bias;
  if (layout != KVScale::none) {
    r.q8.inputs.k_scale = r.k_scale;
    r.q8.inputs.v_scale = r.v_scale;
  }

  const auto plain = [&](DType dt, const Tensor& k, const Tensor& v) {
    Problem d = r.q8;
    d.spec.dtype = dt;
    d.spec.kv_dtype.reset();
    d.spec.kv_scale = KVScale::none;
    d.q = convert(r.q8.q, dt);
    d.bias = convert(r.q8.bias, dt);
    d.k = k;
    d.v = v;
    d.inputs.q = d.q;
    d.inputs.k = k;
    d.inputs.v = v;
    d.inputs.k_scale = {};
    d.inputs.v_scale = {};
    if (d.bias.defined()) d.inputs.bias = d.bias;
    if (p.sinks.defined()) {
      d.sinks = convert(p.sinks, d.spec.lse_dtype());
      d.inputs.sinks = d.sinks;
    }
    return d;
  };
  r.f64 = plain(DType::f64, k64, v64);
  r.narrow = plain(qdtype, kq, vq);
  return r;
}

// The kernel's result on an 8-bit problem against the f64 reference on the
// dequantized K/V, by FlashAttention's same-precision rule (half_baseline.h):
// error <= 2 x a naive run's (the reference in the query dtype with every
// intermediate rounded to it, on K/V dequantized to that dtype; for f32
// queries f32 accumulation) + the dtype's rounding floor.
inline void expect_kv8_within_rule(const PassResults& got, const Kv8Problem& k, const std::string& what) {
  const DType dt = k.q8.spec.dtype;
  const PassResults ref64 = run_backend(*make_reference_backend(), k.f64, false);
  const PassResults naive = run_backend(
      *make_reference_backend({.accumulate_f64 = false, .round_intermediates_to_input_dtype = dt != DType::f32}),
      k.narrow, false);
  SCOPED_TRACE(what);
  expect_half_within("out", got.out, naive.out, convert(ref64.out, dt), 2, dt);
  expect_half_within("lse", got.lse, naive.lse, ref64.lse, 2, DType::f32);
}

}  // namespace attend::testing
