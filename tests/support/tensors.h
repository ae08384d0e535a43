// Test helpers: random problem tensors for a spec, in its layout.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attend/attend.h"
#include "kernel/half.h"

namespace attend::testing {

inline Tensor token_tensor(const AttentionSpec& s, std::int64_t rows, std::int64_t total,
                           std::int64_t heads, std::int64_t dim, DType dtype) {
  switch (s.layout) {
    case Layout::bshd: return Tensor::zeros(dtype, {s.batch, rows, heads, dim});
    case Layout::bhsd: return Tensor::zeros(dtype, {s.batch, heads, rows, dim});
    case Layout::sbhd: return Tensor::zeros(dtype, {rows, s.batch, heads, dim});
    case Layout::thd: return Tensor::zeros(dtype, {total, heads, dim});
  }
  return {};
}

// Element i of a contiguous f32/f64/bf16/f16 tensor, as double.
inline double element(const TensorView& t, std::int64_t i) {
  switch (t.dtype) {
    case DType::f64: return t.as<double>()[i];
    case DType::bf16: return static_cast<float>(t.as<detail::bf16_t>()[i]);
    case DType::f16: return static_cast<float>(t.as<detail::f16_t>()[i]);
    default: return t.as<float>()[i];
  }
}

// Stores x (rounded to nearest even for bf16/f16) as element i.
inline void set_element(const TensorView& t, std::int64_t i, double x) {
  switch (t.dtype) {
    case DType::f64: t.as<double>()[i] = x; return;
    case DType::bf16: t.as<detail::bf16_t>()[i] = detail::bf16_t(x); return;
    case DType::f16: t.as<detail::f16_t>()[i] = detail::f16_t(x); return;
    default: t.as<float>()[i] = static_cast<float>(x); return;
  }
}

inline void fill_normal(const Tensor& t, std::uint64_t seed, double stddev = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  const std::int64_t n = t.numel();
  if (t.view().dtype == DType::f64) {
    for (std::int64_t i = 0; i < n; ++i) t.as<double>()[i] = dist(rng);
  } else {
    for (std::int64_t i = 0; i < n; ++i) set_element(t, i, static_cast<float>(dist(rng)));
  }
}

// Owns every tensor of a random problem; `inputs` views them.
struct Problem {
  AttentionSpec spec;
  Tensor q, k, v, dout, bias, slopes, cu_q, cu_kv;
  Inputs inputs;
  Tensor sinks{};  // softmax_type = learnable: (H) sink logits
};

// Random q, k, v, dout (and bias/slopes when the spec asks). For varlen pass
// per-sequence lengths; spec.batch/seqlen/total fields are filled in from them.
inline Problem make_problem(AttentionSpec s, std::uint64_t seed, std::vector<std::int32_t> lens_q = {},
                            std::vector<std::int32_t> lens_kv = {}) {
  Problem p;
  if (s.varlen()) {
    s.batch = static_cast<std::int64_t>(lens_q.size());
    p.cu_q = Tensor::zeros(DType::i32, {s.batch + 1});
    p.cu_kv = Tensor::zeros(DType::i32, {s.batch + 1});
    for (std::int64_t b = 0; b < s.batch; ++b) {
      p.cu_q.as<std::int32_t>()[b + 1] = p.cu_q.as<std::int32_t>()[b] + lens_q[b];
      p.cu_kv.as<std::int32_t>()[b + 1] = p.cu_kv.as<std::int32_t>()[b] + lens_kv[b];
    }
    s.total_q = p.cu_q.as<std::int32_t>()[s.batch];
    s.total_kv = p.cu_kv.as<std::int32_t>()[s.batch];
    s.seqlen_q = *std::max_element(lens_q.begin(), lens_q.end());
    s.seqlen_kv = *std::max_element(lens_kv.begin(), lens_kv.end());
    p.inputs.cu_seqlens_q = p.cu_q;
    p.inputs.cu_seqlens_kv = p.cu_kv;
  }
  p.q = token_tensor(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_qk, s.dtype);
  p.k = token_tensor(s, s.seqlen_kv, s.total_kv, s.heads_kv, s.head_dim_qk, s.dtype);
  p.v = token_tensor(s, s.seqlen_kv, s.total_kv, s.heads_kv, s.head_dim_v, s.dtype);
  p.dout = token_tensor(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_v, s.dtype);
  fill_normal(p.q, seed);
  fill_normal(p.k, seed + 1);
  fill_normal(p.v, seed + 2);
  fill_normal(p.dout, seed + 3);
  p.inputs.q = p.q;
  p.inputs.k = p.k;
  p.inputs.v = p.v;
  if (s.has_bias) {
    p.bias = Tensor::zeros(s.dtype, {s.batch, s.heads_q, s.seqlen_q, s.seqlen_kv});
    fill_normal(p.bias, seed + 4, 0.5);
    p.inputs.bias = p.bias;
  }
  if (s.alibi) {
    p.slopes = Tensor::zeros(DType::f32, {s.heads_q});
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      p.slopes.as<float>()[h] = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(s.heads_q));
    }
    p.inputs.alibi_slopes = p.slopes;
  }
  if (s.softmax_type == SoftmaxType::learnable) {
    // Around the logits' own size, so that the sink takes a real share of some
    // rows and almost none of others.
    p.sinks = Tensor::zeros(s.lse_dtype(), {s.heads_q});
    fill_normal(p.sinks, seed + 5, 1.5);
    p.inputs.sinks = p.sinks;
  }
  p.spec = s;
  return p;
}

// max |a - b| over two tensors of the same shape (any float dtypes, mixed allowed).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = element(a, i);
    const double y = element(b, i);
    if (std::isinf(x) && std::isinf(y) && (x > 0) == (y > 0)) continue;
    m = std::max(m, std::abs(x - y));
    if (std::isnan(x) != std::isnan(y)) return INFINITY;
  }
  return m;
}

}  // namespace attend::testing

namespace attend::testing {

// A copy of `t` converted to f64 (i32 and f64 tensors are copied as they are).
inline Tensor to_f64(const Tensor& t) {
  if (!t.defined() || t.view().dtype == DType::f64 || t.view().dtype == DType::i32) {
    if (!t.defined()) return t;
    Tensor c = Tensor::zeros_like(t.view());
    std::copy_n(static_cast<const std::byte*>(t.data()), t.numel() * static_cast<std::int64_t>(size_of(t.view().dtype)),
                static_cast<std::byte*>(c.data()));
    return c;
  }
  TensorView v = t.view();
  v.dtype = DType::f64;
  Tensor c = Tensor::zeros_like(v);
  for (std::int64_t i = 0; i < t.numel(); ++i) c.as<double>()[i] = element(t, i);
  return c;
}

// A copy of `t` converted to `dtype` (rounded to nearest even when narrowing).
inline Tensor convert(const Tensor& t, DType dtype) {
  if (!t.defined()) return t;
  TensorView v = t.view();
  v.dtype = dtype;
  Tensor c = Tensor::zeros_like(v);
  for (std::int64_t i = 0; i < t.numel(); ++i) set_element(c, i, element(t, i));
  return c;
}

// The same problem in f64 (ALiBi slopes stay f32, as the API requires).
inline Problem problem_as_f64(const Problem& p) {
  Problem d;
  d.spec = p.spec;
  d.spec.dtype = DType::f64;
  d.q = to_f64(p.q);
  d.k = to_f64(p.k);
  d.v = to_f64(p.v);
  d.dout = to_f64(p.dout);
  d.bias = to_f64(p.bias);
  d.slopes = p.slopes;
  d.cu_q = p.cu_q;
  d.cu_kv = p.cu_kv;
  d.inputs = {d.q, d.k, d.v, d.bias, d.slopes, d.cu_q, d.cu_kv};
  d.sinks = to_f64(p.sinks);
  d.inputs.sinks = d.sinks;
  return d;
}

// Forward (and backward) outputs of one backend on one problem.
struct PassResults {
  Tensor out, lse, dq, dk, dv, dbias;
  Tensor dsinks{};  // softmax_type = learnable
};

inline PassResults run_backend(const Backend& backend, const Problem& p, bool with_backward) {
  const AttentionSpec& s = p.spec;
  PassResults r;
  r.out = token_tensor(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_v, s.dtype);
  const DType lse_t = s.dtype == DType::f64 ? DType::f64 : DType::f32;
  r.lse = s.varlen() ? Tensor::zeros(lse_t, {s.heads_q, s.total_q}) : Tensor::zeros(lse_t, {s.batch, s.heads_q, s.seqlen_q});
  backend.forward(ForwardArgs{s, p.inputs, r.out, r.lse});
  if (with_backward) {
    TensorView dq = p.q.view();
    dq.dtype = s.effective_dq_dtype();
    r.dq = Tensor::zeros_like(dq);
    r.dk = Tensor::zeros_like(p.k);
    r.dv = Tensor::zeros_like(p.v);
    if (s.bias_requires_grad) r.dbias = Tensor::zeros_like(p.bias);
    if (s.softmax_type == SoftmaxType::learnable) r.dsinks = Tensor::zeros(s.lse_dtype(), {s.heads_q});
    backend.backward(BackwardArgs{s, p.inputs, r.out, r.lse, p.dout, r.dq, r.dk, r.dv, r.dbias, {}, {}, {}, r.dsinks});
  }
  return r;
}

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = element(t, i);
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  }
  return m;
}

// A copy of a contiguous (B, S, H, D) tensor inside rows of `pad` elements whose
// gaps hold NaN; the returned view shows only the data (strided, last dim contiguous).
inline TensorView nan_padded(const Tensor& t, std::int64_t pad, Tensor& storage) {
  const TensorView& v = t.view();
  storage = Tensor::zeros(v.dtype, {v.shape[0], v.shape[1], v.shape[2], pad});
  for (std::int64_t i = 0; i < storage.numel(); ++i) set_element(storage, i, std::nan(""));
  const std::int64_t rows = v.shape[0] * v.shape[1] * v.shape[2], d = v.shape[3];
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < d; ++c) set_element(storage, r * pad + c, element(t, r * d + c));
  }
  TensorView out = storage.view();
  out.shape[3] = d;
  return out;
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::equal(static_cast<const std::byte*>(a.data()),
                    static_cast<const std::byte*>(a.data()) + a.numel() * static_cast<std::int64_t>(size_of(a.view().dtype)),
                    static_cast<const std::byte*>(b.data()));
}

}  // namespace attend::testing
