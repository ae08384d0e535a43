#include "check.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>

#include "attend/backends/reference.h"
#include "elements.h"

namespace attend_cli {

namespace {

ErrorStats compare(std::string name, const attend::TensorView& got, const attend::TensorView& ref) {
  ErrorStats st;
  st.name = std::move(name);
  const std::int64_t n = ref.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = load(got.data, got.dtype, i);
    const double r = load(ref.data, ref.dtype, i);
    const double err = (g == r) ? 0.0 : std::fabs(g - r);  // -inf == -inf (empty rows) is exact
    if (std::isnan(err) || err > st.max_abs_err) st.max_abs_err = err;
    if (std::isnan(st.max_abs_err)) break;
    if (std::isfinite(r)) st.max_ref = std::max(st.max_ref, std::fabs(r));
  }
  st.max_rel_err = st.max_ref > 0.0 ? st.max_abs_err / st.max_ref : st.max_abs_err;
  return st;
}

std::vector<std::byte> workspace_for(const attend::Backend& b, const attend::AttentionSpec& s,
                                     attend::Pass pass) {
  return std::vector<std::byte>(b.workspace_bytes(s, pass));
}

// The values an 8-bit k or v stands for, code * scale, in f64 (exact: a
// code has at most 4 significant bits beyond i8's 7, a scale 24).
attend::Tensor dequantize(const attend::AttentionSpec& s, const attend::Inputs& in, const attend::TensorView& codes,
                          const attend::TensorView& scale) {
  const Shape shape(codes.shape.begin(), codes.shape.begin() + codes.ndim);
  attend::Tensor out = zeros(attend::DType::f64, shape);
  const std::int64_t dim = shape.back(), rows = codes.numel() / dim;
  const KVScaleIndex index(s, shape, in.cu_seqlens_kv, in.block_table);
  auto* o = out.as<double>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = index(r);
    // kv_scale none: the codes are the values; a page no sequence owns is never read.
    const double g = scale.data == nullptr ? 1.0 : i < 0 ? 0.0 : static_cast<const float*>(scale.data)[i];
    for (std::int64_t j = 0; j < dim; ++j) o[r * dim + j] = load(codes.data, codes.dtype, r * dim + j) * g;
  }
  return out;
}

}  // namespace

double default_tolerance(attend::DType dtype) {
  switch (dtype) {
    case attend::DType::f64: return 1e-10;
    case attend::DType::f32: return 1e-4;
    default: return 2e-2;
  }
}

std::vector<ErrorStats> check_against_reference(const Problem& p, const ProblemData& data,
                                                const attend::ForwardResult& fwd,
                                                const attend::Gradients* grads) {
  using attend::DType;
  attend::AttentionSpec s64 = p.spec;
  s64.dtype = DType::f64;
  s64.dq_dtype.reset();
  s64.out_dtype.reset();
  s64.accumulate_grads = false;  // into zeros, as run provides them: the same gradients
  s64.need_lse = true;
  // 8-bit K/V: the reference reads the values the codes stand for (code *
  // scale, exactly), so the check measures the kernel's arithmetic on the
  // quantized cache, not the quantization error (bench/kv8_error measures that).
  s64.kv_dtype.reset();
  s64.kv_scale = attend::KVScale::none;
  const auto ref = attend::make_reference_backend();

  // The same inputs with q, k, v (a cache's page pools) and bias in f64; slopes
  // stay f32 and cu_seqlens and the cache's tables i32: they have fixed dtypes.
  attend::Inputs in = data.inputs();
  const bool kv8 = p.spec.kv_quantized();
  const attend::Tensor q64 = convert(in.q, DType::f64),
                       k64 = kv8 ? dequantize(p.spec, in, in.k, in.k_scale) : convert(in.k, DType::f64),
                       v64 = kv8 ? dequantize(p.spec, in, in.v, in.v_scale) : convert(in.v, DType::f64);
  in.k_scale = {};
  in.v_scale = {};
  const attend::Tensor bias64 = data.bias.defined() ? convert(data.bias, DType::f64) : attend::Tensor{};
  in.q = q64;
  in.k = k64;
  in.v = v64;
  if (bias64.defined()) in.bias = bias64;
  // Sink logits in the f64 problem's dtype (f64 for the oracle).
  const attend::Tensor sinks64 = data.sinks.defined() ? convert(data.sinks, DType::f64) : attend::Tensor{};
  if (sinks64.defined()) in.sinks = sinks64;

  attend::Tensor out = zeros(DType::f64, out_shape(s64));
  attend::Tensor lse = zeros(DType::f64, lse_shape(s64));
  auto ws = workspace_for(*ref, s64, attend::Pass::forward);
  ref->forward(attend::ForwardArgs{s64, in, out, lse, attend::Workspace{ws.data(), ws.size()}});

  std::vector<ErrorStats> stats;
  stats.push_back(compare("out", fwd.out, out));
  if (p.spec.need_lse || p.mode == attend::Mode::training) stats.push_back(compare("lse", fwd.lse, lse));
  if (grads == nullptr) return stats;

  const attend::Tensor dout = convert(data.dout, DType::f64);
  attend::Tensor dq = zeros(DType::f64, q_shape(s64));
  attend::Tensor dk = zeros(DType::f64, k_shape(s64));
  attend::Tensor dv = zeros(DType::f64, v_shape(s64));
  attend::Tensor dbias;
  if (s64.bias_requires_grad) dbias = attend::Tensor::zeros_like(bias64);
  attend::Tensor dsinks;
  if (sinks64.defined()) dsinks = attend::Tensor::zeros_like(sinks64);
  ws = workspace_for(*ref, s64, attend::Pass::backward);
  ref->backward(attend::BackwardArgs{s64,
                                     in,
                                     out,
                                     lse,
                                     dout,
                                     dq,
                                     dk,
                                     dv,
                                     dbias.defined() ? dbias.view() : attend::TensorView{},
                                     attend::Workspace{ws.data(), ws.size()},
                                     {},
                                     {},
                                     dsinks.defined() ? dsinks.view() : attend::TensorView{}});
  stats.push_back(compare("dq", grads->dq, dq));
  stats.push_back(compare("dk", grads->dk, dk));
  stats.push_back(compare("dv", grads->dv, dv));
  if (dbias.defined()) stats.push_back(compare("dbias", grads->dbias, dbias));
  if (dsinks.defined()) stats.push_back(compare("dsinks", grads->dsinks, dsinks));
  return stats;
}

}  // namespace attend_cli
