// What a careless caller can hand the runtime and still get defined results:
// packed batches with trailing padding rows, empty gradients with zero strides,
// an empty Tensor (issue 36, rows 1, 5 and 6).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "attend/attend.h"
#include "support/tensors.h"

namespace attend {
namespace {

namespace t = testing;

constexpr std::int64_t kPadQ = 3, kPadKv = 2;

// A copy of a (total, H, D) tensor with `pad` more rows of random values: the
// trailing padding of a packed batch, which no sequence covers.
Tensor padded(const Tensor& x, std::int64_t pad, std::uint64_t seed) {
  const TensorView& v = x.view();
  Tensor p = Tensor::zeros(v.dtype, {v.shape[0] + pad, v.shape[1], v.shape[2]});
  t::fill_normal(p, seed);
  std::memcpy(p.data(), x.data(), static_cast<std::size_t>(x.numel()) * size_of(v.dtype));
  return p;
}

// Same shape as `like`, every element NaN: what a caching allocator may hand back.
Tensor nans_like(const TensorView& like, DType dtype) {
  TensorView v = like;
  v.dtype = dtype;
  Tensor n = Tensor::zeros_like(v);
  for (std::int64_t i = 0; i < n.numel(); ++i) t::set_element(n, i, std::numeric_limits<double>::quiet_NaN());
  return n;
}

// The first `n` elements of `a` and `b` are the same bits.
bool same_prefix(const Tensor& a, const Tensor& b, std::int64_t n) {
  return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(n) * size_of(a.view().dtype)) == 0;
}

bool all_equal(const Tensor& x, std::int64_t from, double value) {
  for (std::int64_t i = from; i < x.numel(); ++i) {
    if (!(t::element(x, i) == value)) return false;
  }
  return true;
}

struct Padded {
  t::Problem plain;  // cu_seqlens cover every row
  AttentionSpec spec;
  Tensor q, k, v, dout;
  Inputs inputs;
};

Padded make_padded(DType dtype) {
  AttentionSpec s;
  s.layout = Layout::thd;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = 16;
  s.head_dim_v = 16;
  s.causal = true;
  s.dtype = dtype;
  Padded p;
  p.plain = t::make_problem(s, 7, {3, 5, 4}, {3, 6, 4});
  p.spec = p.plain.spec;
  p.spec.total_q += kPadQ;
  p.spec.total_kv += kPadKv;
  p.q = padded(p.plain.q, kPadQ, 11);
  p.k = padded(p.plain.k, kPadKv, 12);
  p.v = padded(p.plain.v, kPadKv, 13);
  p.dout = padded(p.plain.dout, kPadQ, 14);
  p.inputs = p.plain.inputs;
  p.inputs.q = p.q;
  p.inputs.k = p.k;
  p.inputs.v = p.v;
  return p;
}

// Every backend that runs a packed batch, both passes, into NaN-filled
// buffers: the covered rows are the bits of the unpadded run, the padding rows
// out 0, LSE -inf, dq 0, dk and dv 0.
void expect_padding_rows_defined(DType dtype, int min_backends) {
  const Padded p = make_padded(dtype);
  const AttentionSpec& s = p.spec;
  const std::int64_t cov_q = p.plain.spec.total_q, cov_kv = p.plain.spec.total_kv;
  int backends = 0;
  for (const auto& e : Registry::global().backends()) {
    const Backend& b = *e.backend;
    if (!b.check(s, Pass::forward).ok()) continue;
    ++backends;
    SCOPED_TRACE(std::string(b.name()));
    const bool bwd = b.check(s, Pass::backward).ok();
    const t::PassResults want = t::run_backend(b, p.plain, bwd);

    const Tensor out = nans_like(p.dout, s.effective_out_dtype());
    const Tensor lse = nans_like(Tensor::zeros(s.lse_dtype(), {s.heads_q, s.total_q}), s.lse_dtype());
    b.forward(ForwardArgs{s, p.inputs, out, lse});
    const std::int64_t row_out = s.heads_q * s.head_dim_v;
    EXPECT_TRUE(same_prefix(out, want.out, cov_q * row_out));
    EXPECT_TRUE(all_equal(out, cov_q * row_out, 0.0));
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      for (std::int64_t i = 0; i < s.total_q; ++i) {
        const double got = t::element(lse, h * s.total_q + i);
        if (i < cov_q) {
          EXPECT_EQ(got, t::element(want.lse, h * cov_q + i)) << "h=" << h << " i=" << i;
        } else {
          EXPECT_EQ(got, -std::numeric_limits<double>::infinity()) << "h=" << h << " i=" << i;
        }
      }
    }
    if (!bwd) continue;
    const Tensor dq = nans_like(p.q, s.effective_dq_dtype()), dk = nans_like(p.k, s.dtype),
                 dv = nans_like(p.v, s.dtype);
    b.backward(BackwardArgs{s, p.inputs, out, lse, p.dout, dq, dk, dv, {}});
    EXPECT_TRUE(same_prefix(dq, want.dq, cov_q * s.heads_q * s.head_dim_qk));
    EXPECT_TRUE(same_prefix(dk, want.dk, cov_kv * s.heads_kv * s.head_dim_qk));
    EXPECT_TRUE(same_prefix(dv, want.dv, cov_kv * s.heads_kv * s.head_dim_v));
    EXPECT_TRUE(all_equal(dq, cov_q * s.heads_q * s.head_dim_qk, 0.0));
    EXPECT_TRUE(all_equal(dk, cov_kv * s.heads_kv * s.head_dim_qk, 0.0));
    EXPECT_TRUE(all_equal(dv, cov_kv * s.heads_kv * s.head_dim_v, 0.0));
  }
  EXPECT_GE(backends, min_backends);
}

// reference and flash run packed f32 and bf16 batches; f64 is the reference's alone.
TEST(PackedPadding, RowsPastCuSeqlensAreDefinedOnEveryBackendF32) { expect_padding_rows_defined(DType::f32, 2); }
TEST(PackedPadding, RowsPastCuSeqlensAreDefinedOnEveryBackendBf16) { expect_padding_rows_defined(DType::bf16, 2); }
TEST(PackedPadding, RowsPastCuSeqlensAreDefinedOnEveryBackendF64) { expect_padding_rows_defined(DType::f64, 1); }

// The high-level API into caller buffers (a plan, the path the Python package
// takes) defines them too, and accumulate_grads leaves them as they were.
TEST(PackedPadding, HighLevelCallsDefineThemAndAccumulationLeavesThemAlone) {
  const Padded p = make_padded(DType::f32);
  CallOptions o;
  const Tensor out = nans_like(p.dout, DType::f32);
  const Tensor lse = nans_like(Tensor::zeros(DType::f32, {p.spec.heads_q, p.spec.total_q}), DType::f32);
  o.out = out;
  o.lse = lse;
  const ForwardResult r = forward(p.inputs, p.spec, Mode::training, o);
  const std::int64_t cov_q = p.plain.spec.total_q, cov_kv = p.plain.spec.total_kv;
  EXPECT_TRUE(all_equal(out, cov_q * p.spec.heads_q * p.spec.head_dim_v, 0.0));
  CallOptions g;
  const Tensor dq = nans_like(p.q, DType::f32), dk = nans_like(p.k, DType::f32), dv = nans_like(p.v, DType::f32);
  g.grads.dq = dq;
  g.grads.dk = dk;
  g.grads.dv = dv;
  (void)backward(r.ctx, p.dout, g);
  EXPECT_TRUE(all_equal(dq, cov_q * p.spec.heads_q * p.spec.head_dim_qk, 0.0));
  EXPECT_TRUE(all_equal(dk, cov_kv * p.spec.heads_kv * p.spec.head_dim_qk, 0.0));

  // Accumulating: padding rows get nothing added, so they keep their 7s.
  AttentionSpec acc = p.spec;
  acc.accumulate_grads = true;
  const Tensor dq7 = Tensor::zeros_like(p.q), dk7 = Tensor::zeros_like(p.k), dv7 = Tensor::zeros_like(p.v);
  for (const Tensor* x : {&dq7, &dk7, &dv7}) {
    for (std::int64_t i = 0; i < x->numel(); ++i) t::set_element(*x, i, 7.0);
  }
  CallOptions a;
  a.grads.dq = dq7;
  a.grads.dk = dk7;
  a.grads.dv = dv7;
  (void)backward(acc, p.inputs, out, lse, p.dout, a);
  EXPECT_TRUE(all_equal(dq7, cov_q * p.spec.heads_q * p.spec.head_dim_qk, 7.0));
  EXPECT_TRUE(all_equal(dk7, cov_kv * p.spec.heads_kv * p.spec.head_dim_qk, 7.0));
  EXPECT_TRUE(all_equal(dv7, cov_kv * p.spec.heads_kv * p.spec.head_dim_v, 7.0));
}

// torch's gradient of x.sum() for an empty x is an expanded tensor with every
// stride 0; an empty view addresses nothing, so its strides cannot matter.
TEST(ZeroQueries, BackwardAcceptsAnEmptyDoutWithZeroStridesAndZeroesDkDv) {
  AttentionSpec s;
  s.batch = 1;
  s.seqlen_q = 0;
  s.seqlen_kv = 5;
  s.heads_q = 2;
  s.heads_kv = 2;
  s.head_dim_qk = 32;
  s.head_dim_v = 32;
  const t::Problem p = t::make_problem(s, 3);
  const ForwardResult r = forward(p.inputs, s, Mode::training);
  TensorView dout = p.dout.view();
  dout.strides = {0, 0, 0, 0};
  const Gradients g = backward(r.ctx, dout);
  EXPECT_EQ(g.dq.numel(), 0);
  EXPECT_TRUE(all_equal(g.dk, 0, 0.0));
  EXPECT_TRUE(all_equal(g.dv, 0, 0.0));
}

TEST(TensorNumel, AnEmptyTensorHasNoElements) {
  EXPECT_EQ(Tensor().numel(), 0);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_EQ(Tensor::zeros(DType::f32, {3, 0}).numel(), 0);
  EXPECT_EQ(Tensor::zeros(DType::f32, {2, 3}).numel(), 6);
}

}  // namespace
}  // namespace attend
