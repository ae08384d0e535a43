#include "runtime/tune_data.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attend/error.h"
#include "kernel/half.h"
#include "runtime/checked.h"

namespace attend::detail {

namespace {

// Values in [-1, 1): enough spread that softmax rows are not uniform.
void fill(const Tensor& t, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  const auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<std::int64_t>(x >> 40) - (std::int64_t{1} << 23)) * 0x1p-23f;
  };
  const std::int64_t n = t.numel();
  switch (t.view().dtype) {
    case DType::f32:
      for (std::int64_t i = 0; i < n; ++i) t.as<float>()[i] = next();
      break;
    case DType::f64:
      for (std::int64_t i = 0; i < n; ++i) t.as<double>()[i] = next();
      break;
    case DType::bf16:
      for (std::int64_t i = 0; i < n; ++i) t.as<std::uint16_t>()[i] = f32_to_bf16_bits(next());
      break;
    case DType::f16:
      for (std::int64_t i = 0; i < n; ++i) t.as<std::uint16_t>()[i] = f32_to_f16_bits(next());
      break;
    default: break;
  }
}

TensorView add(TuneData& d, DType dtype, Shape shape, std::uint64_t seed) {
  d.owned.push_back(Tensor::zeros(dtype, shape.span()));
  if (seed) fill(d.owned.back(), seed);
  return d.owned.back().view();
}

TensorView add(TuneData& d, DType dtype, std::initializer_list<std::int64_t> dims, std::uint64_t seed) {
  Shape s;
  for (std::int64_t v : dims) s.dims[s.ndim++] = v;
  return add(d, dtype, s, seed);
}

// cu_seqlens spreading `total` tokens over the batch, none above `max`. The
// entries are int32: a total beyond its range covers only the first
// INT32_MAX tokens (the rest are padding rows, which the runtime defines)
// rather than wrapping around into a decreasing, invalid cu_seqlens.
TensorView cu_seqlens(TuneData& d, const AttentionSpec& s, std::int64_t total, std::int64_t max) {
  TensorView t = add(d, DType::i32, {s.batch + 1}, 0);
  auto* cu = t.as<std::int32_t>();
  std::int64_t left = std::min<std::int64_t>(total, std::numeric_limits<std::int32_t>::max());
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const std::int64_t len = std::min(max, left / (s.batch - b) + (left % (s.batch - b) ? 1 : 0));
    cu[b + 1] = static_cast<std::int32_t>(cu[b] + len);
    left -= len;
  }
  return t;
}

}  // namespace

TuneData make_tune_data(const AttentionSpec& s, Mode mode) {
  TuneData d;
  d.in.q = add(d, s.dtype, expected_shape(s, Role::q), 1);
  if (s.paged()) {
    const std::int64_t per_seq = ceil_div(s.seqlen_kv, s.kv_page_size);
    const std::int64_t pages = checked_mul(s.batch, per_seq, "tune: pages");
    d.in.k = add(d, s.dtype, {pages, s.kv_page_size, s.heads_kv, s.head_dim_qk}, 2);
    d.in.v = add(d, s.dtype, {pages, s.kv_page_size, s.heads_kv, s.head_dim_v}, 3);
    d.in.block_table = add(d, DType::i32, {s.batch, per_seq}, 0);
    d.in.cache_seqlens = add(d, DType::i32, {s.batch}, 0);
    for (std::int64_t i = 0; i < pages; ++i) d.in.block_table.as<std::int32_t>()[i] = static_cast<std::int32_t>(i);
    for (std::int64_t b = 0; b < s.batch; ++b)
      d.in.cache_seqlens.as<std::int32_t>()[b] = static_cast<std::int32_t>(s.seqlen_kv);
    if (s.kv_leftpad) d.in.cache_leftpad = add(d, DType::i32, {s.batch}, 0);
  } else {
    d.in.k = add(d, s.dtype, expected_shape(s, Role::k), 2);
    d.in.v = add(d, s.dtype, expected_shape(s, Role::v), 3);
  }
  if (s.varlen()) {
    d.in.cu_seqlens_q = cu_seqlens(d, s, s.total_q, s.seqlen_q);
    d.in.cu_seqlens_kv = cu_seqlens(d, s, s.total_kv, s.seqlen_kv);
  }
  if (s.has_bias) d.in.bias = add(d, s.dtype, expected_shape(s, Role::bias), 4);
  if (s.alibi) {
    d.in.alibi_slopes = add(d, DType::f32, {s.heads_q}, 0);
    for (std::int64_t h = 0; h < s.heads_q; ++h) d.in.alibi_slopes.as<float>()[h] = 1.0f / static_cast<float>(h + 2);
  }
  d.out = add(d, s.effective_out_dtype(), expected_shape(s, Role::out), 0);
  d.lse = add(d, s.lse_dtype(), expected_shape(s, Role::lse), 0);
  if (mode == Mode::training) {
    d.dout = add(d, s.effective_out_dtype(), expected_shape(s, Role::dout), 5);
    d.dq = add(d, s.effective_dq_dtype(), expected_shape(s, Role::dq), 0);
    d.dk = add(d, s.dtype,
               s.paged() ? Shape{4, {d.in.k.shape[0], d.in.k.shape[1], d.in.k.shape[2], d.in.k.shape[3]}}
                         : expected_shape(s, Role::dk),
               0);
    d.dv = add(d, s.dtype,
               s.paged() ? Shape{4, {d.in.v.shape[0], d.in.v.shape[1], d.in.v.shape[2], d.in.v.shape[3]}}
                         : expected_shape(s, Role::dv),
               0);
    if (s.bias_requires_grad) d.dbias = add(d, s.dtype, expected_shape(s, Role::bias), 0);
  }
  return d;
}

}  // namespace attend::detail
