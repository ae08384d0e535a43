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
  s64.need_lse = true;
  const auto ref = attend::make_reference_backend();

  ProblemData d64;  // slopes stay f32 and cu_seqlens i32: they have fixed dtypes
  d64.q = convert(data.q, DType::f64);
  d64.k = convert(data.k, DType::f64);
  d64.v = convert(data.v, DType::f64);
  if (data.bias.defined()) d64.bias = convert(data.bias, DType::f64);
  d64.slopes = data.slopes;
  d64.cu_seqlens_q = data.cu_seqlens_q;
  d64.cu_seqlens_kv = data.cu_seqlens_kv;
  if (data.k_pool.defined()) {  // the same pages in f64, the same block table
    d64.k_pool = convert(data.k_pool, DType::f64);
    d64.v_pool = convert(data.v_pool, DType::f64);
    d64.block_table = data.block_table;
    d64.cache_seqlens = data.cache_seqlens;
    d64.cache_leftpad = data.cache_leftpad;
  }
  const attend::Inputs in = d64.inputs();

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
  if (s64.bias_requires_grad) dbias = attend::Tensor::zeros_like(d64.bias);
  ws = workspace_for(*ref, s64, attend::Pass::backward);
  ref->backward(attend::BackwardArgs{s64, in, out, lse, dout, dq, dk, dv,
                                     dbias.defined() ? dbias.view() : attend::TensorView{},
                                     attend::Workspace{ws.data(), ws.size()}});
  stats.push_back(compare("dq", grads->dq, dq));
  stats.push_back(compare("dk", grads->dk, dk));
  stats.push_back(compare("dv", grads->dv, dv));
  if (dbias.defined()) stats.push_back(compare("dbias", grads->dbias, dbias));
  return stats;
}

}  // namespace attend_cli
