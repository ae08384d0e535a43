// Shared helpers for the reference backend tests: owned problems with random
// data in any layout, calls through the Backend interface, and an independent
// loop-by-loop attention used as the forward oracle.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "kernel/philox.h"

namespace reftest {

using attend::AttentionSpec;
using attend::Backend;
using attend::DType;
using attend::Layout;
using attend::Tensor;
using attend::TensorView;

inline Tensor zeros(DType dtype, const std::vector<std::int64_t>& shape) {
  return Tensor::zeros(dtype, std::span<const std::int64_t>(shape));
}

// Shape of a q/k/v/out-like tensor in `layout` (thd: (total, heads, dim)).
inline std::vector<std::int64_t> token_shape(const AttentionSpec& s, std::int64_t seq, std::int64_t total,
                                             std::int64_t heads, std::int64_t dim) {
  switch (s.layout) {
    case Layout::bshd:
      return {s.batch, seq, heads, dim};
    case Layout::bhsd:
      return {s.batch, heads, seq, dim};
    case Layout::sbhd:
      return {seq, s.batch, heads, dim};
    case Layout::thd:
      return {total, heads, dim};
  }
  return {};
}

// Element offset of logical (b, token, h, d) in a dense-layout view; written
// from the layout definitions in tensor.h, not from kernel/layout.h.
inline std::int64_t offset(const TensorView& t, Layout layout, std::int64_t b, std::int64_t s, std::int64_t h,
                           std::int64_t d) {
  switch (layout) {
    case Layout::bshd:
      return b * t.strides[0] + s * t.strides[1] + h * t.strides[2] + d;
    case Layout::bhsd:
      return b * t.strides[0] + h * t.strides[1] + s * t.strides[2] + d;
    case Layout::sbhd:
      return s * t.strides[0] + b * t.strides[1] + h * t.strides[2] + d;
    case Layout::thd:
      return s * t.strides[0] + h * t.strides[1] + d;
  }
  return 0;
}

// A problem and the tensors it owns.
struct Case {
  explicit Case(const AttentionSpec& s) : spec(s) {}
  AttentionSpec spec;
  std::vector<std::int32_t> cu_q, cu_kv;  // varlen only
  std::int64_t bias_b = 1, bias_h = 1;    // bias dims (1 or B, 1 or H) when spec.has_bias
  bool alibi_per_batch = false;           // slopes (B,H) instead of (H)
  std::uint64_t seed = 1;
};

struct Problem {
  AttentionSpec spec;
  Tensor q, k, v, bias, slopes, cu_q, cu_kv;
  Tensor sinks{};  // softmax_type = learnable: (H), the LSE's dtype
  attend::Inputs inputs() const {
    attend::Inputs in{q, k, v, bias, slopes, cu_q, cu_kv};
    in.sinks = sinks;
    return in;
  }
};

inline void fill_random(const Tensor& t, std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (t.view().dtype == DType::f64)
      t.as<double>()[i] = dist(rng);
    else
      t.as<float>()[i] = static_cast<float>(dist(rng));
  }
}

inline Problem make_problem(const Case& c) {
  const AttentionSpec& s = c.spec;
  std::mt19937_64 rng(c.seed);
  Problem p{s, {}, {}, {}, {}, {}, {}, {}};
  p.q = zeros(s.dtype, token_shape(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_qk));
  p.k = zeros(s.dtype, token_shape(s, s.seqlen_kv, s.total_kv, s.heads_kv, s.head_dim_qk));
  p.v = zeros(s.dtype, token_shape(s, s.seqlen_kv, s.total_kv, s.heads_kv, s.head_dim_v));
  fill_random(p.q, rng, 1.0);
  fill_random(p.k, rng, 1.0);
  fill_random(p.v, rng, 1.0);
  if (s.has_bias) {
    p.bias = zeros(s.dtype, {c.bias_b, c.bias_h, s.seqlen_q, s.seqlen_kv});
    fill_random(p.bias, rng, 0.5);
  }
  if (s.alibi) {
    p.slopes = c.alibi_per_batch ? zeros(DType::f32, {s.batch, s.heads_q}) : zeros(DType::f32, {s.heads_q});
    std::uniform_real_distribution<float> u(0.05f, 0.6f);
    for (std::int64_t i = 0; i < p.slopes.numel(); ++i) p.slopes.as<float>()[i] = u(rng);
  }
  if (s.softmax_type == attend::SoftmaxType::learnable) {
    p.sinks = zeros(s.dtype == DType::f64 ? DType::f64 : DType::f32, {s.heads_q});
    fill_random(p.sinks, rng, 1.5);
  }
  if (s.varlen()) {
    p.cu_q = zeros(DType::i32, {static_cast<std::int64_t>(c.cu_q.size())});
    p.cu_kv = zeros(DType::i32, {static_cast<std::int64_t>(c.cu_kv.size())});
    std::copy(c.cu_q.begin(), c.cu_q.end(), p.cu_q.as<std::int32_t>());
    std::copy(c.cu_kv.begin(), c.cu_kv.end(), p.cu_kv.as<std::int32_t>());
  }
  return p;
}

struct Scratch {
  std::vector<std::byte> bytes;
  Scratch(const Backend& be, const AttentionSpec& s, attend::Pass pass)
      : bytes(be.workspace_bytes(s, pass)) {}
  attend::Workspace view() { return {bytes.data(), bytes.size()}; }
};

struct Fwd {
  Tensor out, lse;
};

inline Fwd run_forward(const Backend& be, const Problem& p) {
  const AttentionSpec& s = p.spec;
  Fwd f;
  f.out = zeros(s.dtype, token_shape(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_v));
  const DType lse_t = s.dtype == DType::f64 ? DType::f64 : DType::f32;
  f.lse = s.varlen() ? zeros(lse_t, {s.heads_q, s.total_q}) : zeros(lse_t, {s.batch, s.heads_q, s.seqlen_q});
  Scratch ws(be, s, attend::Pass::forward);
  be.forward(attend::ForwardArgs{s, p.inputs(), f.out, f.lse, ws.view()});
  return f;
}

struct Grads {
  Tensor dq, dk, dv, dbias;
  Tensor dsinks{};  // softmax_type = learnable
};

inline Grads run_backward(const Backend& be, const Problem& p, const Fwd& f, const TensorView& dout) {
  const AttentionSpec& s = p.spec;
  Grads g{Tensor::zeros_like(p.q), Tensor::zeros_like(p.k), Tensor::zeros_like(p.v), {}, {}};
  if (s.has_bias && s.bias_requires_grad) g.dbias = Tensor::zeros_like(p.bias);
  if (s.softmax_type == attend::SoftmaxType::learnable) g.dsinks = Tensor::zeros_like(p.sinks);
  Scratch ws(be, s, attend::Pass::backward);
  be.backward(
      attend::BackwardArgs{s, p.inputs(), f.out, f.lse, dout, g.dq, g.dk, g.dv, g.dbias, ws.view(), {}, {}, g.dsinks});
  return g;
}

// The sink logit of head h as the formulas define it; -inf: none.
inline double sink_logit(const Problem& p, std::int64_t h) {
  switch (p.spec.softmax_type) {
    case attend::SoftmaxType::off_by_one: return 0.0;
    case attend::SoftmaxType::learnable:
      return p.sinks.view().dtype == DType::f64 ? p.sinks.as<double>()[h] : p.sinks.as<float>()[h];
    case attend::SoftmaxType::vanilla: break;
  }
  return -std::numeric_limits<double>::infinity();
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  const std::size_t n = static_cast<std::size_t>(a.numel()) * attend::size_of(a.view().dtype);
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), n) == 0;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::abs(a.as<double>()[i] - b.as<double>()[i]));
  return m;
}

// Independent forward for dense layouts, written straight from the formulas in
// spec.h: full Sq x Sk loops with the mask as a predicate, f64 throughout. The
// dropout mask is the shared Philox definition (keep(seed, b, h, row, col)).
inline Fwd naive_forward(const Problem& p) {
  const AttentionSpec& s = p.spec;
  const double inf = std::numeric_limits<double>::infinity();
  Fwd f;
  f.out = zeros(DType::f64, token_shape(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_v));
  f.lse = zeros(DType::f64, {s.batch, s.heads_q, s.seqlen_q});
  const auto mask = attend::detail::DropoutMask::make(s.dropout_seed, s.dropout_p);
  const std::int64_t sq = s.seqlen_q, sk = s.seqlen_kv, off = sk - sq;
  const std::int64_t wr = s.causal ? 0 : s.window_right;
  auto val = [&](const Tensor& t, std::int64_t b, std::int64_t tok, std::int64_t h, std::int64_t d) {
    return t.as<double>()[offset(t, s.layout, b, tok, h, d)];
  };
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      const std::int64_t g = h / (s.heads_q / s.heads_kv);
      double slope = 0;
      if (s.alibi)
        slope = p.slopes.view().ndim == 2 ? p.slopes.as<float>()[b * s.heads_q + h] : p.slopes.as<float>()[h];
      for (std::int64_t i = 0; i < sq; ++i) {
        std::vector<double> sc(static_cast<std::size_t>(sk), -inf);
        for (std::int64_t j = 0; j < sk; ++j) {
          const bool left_ok = s.window_left < 0 || j >= i + off - s.window_left;
          const bool right_ok = wr < 0 || j <= i + off + wr;
          if (!left_ok || !right_ok) continue;
          double x = 0;
          for (std::int64_t d = 0; d < s.head_dim_qk; ++d) x += val(p.q, b, i, h, d) * val(p.k, b, j, g, d);
          x *= s.effective_scale();
          if (s.softcap > 0) x = s.softcap * std::tanh(x / s.softcap);
          x -= slope * static_cast<double>(std::llabs(i + off - j));
          if (s.has_bias) {
            const TensorView& bv = p.bias.view();
            const std::int64_t bb = bv.shape[0] == 1 ? 0 : b, hb = bv.shape[1] == 1 ? 0 : h;
            x += p.bias.as<double>()[((bb * bv.shape[1] + hb) * sq + i) * sk + j];
          }
          sc[static_cast<std::size_t>(j)] = x;
        }
        // The sink is one more column of the row with no value (gpt-oss: concatenate, softmax, drop it).
        const double z = sink_logit(p, h);
        double m = z;
        for (double x : sc) m = std::max(m, x);
        double* lse = f.lse.as<double>() + (b * s.heads_q + h) * sq + i;
        if (m == -inf) {
          *lse = -inf;
          continue;
        }
        double sum = std::exp(z - m);
        for (double x : sc) sum += std::exp(x - m);
        *lse = m + std::log(sum);
        for (std::int64_t j = 0; j < sk; ++j) {
          double pij = std::exp(sc[static_cast<std::size_t>(j)] - m) / sum;
          if (s.dropout_p > 0) pij = mask.keep(b, h, i, j) ? pij / (1 - s.dropout_p) : 0.0;
          for (std::int64_t d = 0; d < s.head_dim_v; ++d)
            f.out.as<double>()[offset(f.out, s.layout, b, i, h, d)] += pij * val(p.v, b, j, g, d);
        }
      }
    }
  return f;
}

}  // namespace reftest
