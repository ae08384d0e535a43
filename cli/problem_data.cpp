#include "problem_data.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "attend/error.h"
#include "attend/kvcache.h"
#include "attend/npy.h"
#include "elements.h"

namespace attend_cli {

namespace {

using attend::AttentionSpec;
using attend::DType;
using attend::Tensor;

Shape token_shape(const AttentionSpec& s, std::int64_t seq, std::int64_t total, std::int64_t heads,
                  std::int64_t dim) {
  switch (s.layout) {
    case attend::Layout::bshd: return {s.batch, seq, heads, dim};
    case attend::Layout::bhsd: return {s.batch, heads, seq, dim};
    case attend::Layout::sbhd: return {seq, s.batch, heads, dim};
    case attend::Layout::thd: return {total, heads, dim};
  }
  return {};
}

Shape view_shape(const attend::TensorView& t) { return Shape(t.shape.begin(), t.shape.begin() + t.ndim); }

// Stream `stream` of a seeded generator: each tensor gets its own sequence, so
// loading q from a file leaves k, v and dout unchanged. Box-Muller over
// mt19937_64 (both fully specified) gives the same data on every platform.
void fill_normal(const Tensor& t, std::uint64_t seed, std::uint32_t stream, double mean = 0.0,
                 double stddev = 1.0) {
  std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32), stream};
  std::mt19937_64 gen(seq);
  const auto uniform = [&] { return (static_cast<double>(gen() >> 11) + 1.0) * 0x1p-53; };  // (0, 1]
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double phi = 2.0 * 3.14159265358979323846 * uniform();
    store(t.data(), t.view().dtype, i, mean + stddev * r * std::cos(phi));
    if (i + 1 < n) store(t.data(), t.view().dtype, i + 1, mean + stddev * r * std::sin(phi));
  }
}

Tensor load_checked(const NpyInput& file, const char* what, DType dtype, const Shape& shape) {
  const Tensor& t = file.tensor;
  const std::string& path = file.path;
  const Shape got = view_shape(t.view());
  // bf16 has no NumPy dtype: it travels as '<f4' and is rounded to nearest even
  // here (exact for arrays --save wrote from bf16 data).
  const DType stored = dtype == DType::bf16 ? DType::f32 : dtype;
  if (t.view().dtype != stored) {
    throw attend::Error(attend::ErrorCode::invalid_argument, std::string(what) + ".dtype",
                        path + ": " + std::string(attend::to_string(t.view().dtype)),
                        std::string("this problem's dtype is ") + std::string(attend::to_string(dtype)) + " (--dtype)" +
                            (dtype == DType::bf16 ? "; bf16 is exchanged as '<f4' arrays" : ""));
  }
  if (dtype == DType::bf16 && got == shape) return convert(t, DType::bf16);
  if (got != shape) {
    throw attend::Error(attend::ErrorCode::shape_mismatch, what,
                        path + ": " + std::string(attend::to_string(t.view().dtype)) + " " + shape_string(got),
                        std::string("this problem needs ") + what + " as " +
                            std::string(attend::to_string(dtype)) + " " + shape_string(shape) +
                            (dtype == DType::bf16 ? " (bf16 is exchanged as '<f4' arrays, rounded on load)" : ""));
  }
  return t;
}

Tensor input(const NpyInput& file, const char* what, DType dtype, const Shape& shape, std::uint64_t seed,
             std::uint32_t stream) {
  if (file.tensor.defined()) return load_checked(file, what, dtype, shape);
  Tensor t = zeros(dtype, shape);
  fill_normal(t, seed, stream);
  return t;
}

Tensor cu_seqlens(const std::vector<std::int64_t>& lens, const char* what) {
  Tensor t = zeros(DType::i32, {static_cast<std::int64_t>(lens.size()) + 1});
  std::int64_t sum = 0;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    sum += lens[b];
    if (sum > std::numeric_limits<std::int32_t>::max()) {
      throw attend::Error(attend::ErrorCode::overflow, what, std::to_string(sum),
                          "total tokens exceed the int32 range of cu_seqlens");
    }
    t.as<std::int32_t>()[b + 1] = static_cast<std::int32_t>(sum);
  }
  return t;
}

// --kv-cache: the tokens (random or from --k/--v as (B, max cached, Hkv, D))
// are appended to an attend::KVCache, sequence b getting its first cache_len(b).
void fill_kv_cache(const Problem& p, const DataSources& src, ProblemData& d) {
  const AttentionSpec& s = p.spec;
  const std::int64_t stored = std::max<std::int64_t>(
      1, p.cache_lens.empty() ? s.seqlen_kv : *std::max_element(p.cache_lens.begin(), p.cache_lens.end()));
  d.k = input(src.k, "k", s.dtype, {s.batch, stored, s.heads_kv, s.head_dim_qk}, src.seed, 2);
  d.v = input(src.v, "v", s.dtype, {s.batch, stored, s.heads_kv, s.head_dim_v}, src.seed, 3);
  attend::KVCacheConfig c;
  c.batch = s.batch;
  c.heads_kv = s.heads_kv;
  c.head_dim_qk = s.head_dim_qk;
  c.head_dim_v = s.head_dim_v;
  c.max_seqlen = stored;
  c.page_size = s.kv_page_size;
  c.dtype = s.dtype;
  attend::KVCache cache(c);
  cache.append(d.k, d.v, p.cache_lens);  // empty: every sequence gets all `stored` (= seqlen_kv) tokens
  for (std::int64_t b = 0; b < s.batch; ++b) cache.set_leftpad(b, p.cache_pad(b));
  d.cache = std::make_shared<const attend::KVCache>(std::move(cache));
}

}  // namespace

NpyInput read_npy_input(const std::string& path) {
  if (path.empty()) return {};
  return {path, attend::read_npy(path)};
}

Shape q_shape(const AttentionSpec& s) { return token_shape(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_qk); }
Shape k_shape(const AttentionSpec& s) { return token_shape(s, s.seqlen_kv, s.total_kv, s.heads_kv, s.head_dim_qk); }
Shape v_shape(const AttentionSpec& s) { return token_shape(s, s.seqlen_kv, s.total_kv, s.heads_kv, s.head_dim_v); }
Shape out_shape(const AttentionSpec& s) { return token_shape(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_v); }
Shape lse_shape(const AttentionSpec& s) {
  return s.varlen() ? Shape{s.heads_q, s.total_q} : Shape{s.batch, s.heads_q, s.seqlen_q};
}
DType lse_dtype(const AttentionSpec& s) { return s.dtype == DType::f64 ? DType::f64 : DType::f32; }

Tensor zeros(DType dtype, const Shape& shape) {
  return Tensor::zeros(dtype, std::span<const std::int64_t>(shape));
}

Tensor convert(const attend::TensorView& t, DType dtype) {
  // Tensors of the tool are contiguous (Tensor::zeros), so a flat loop suffices.
  Tensor out = zeros(dtype, view_shape(t));
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) store(out.data(), dtype, i, load(t.data, t.dtype, i));
  return out;
}

std::string shape_string(const Shape& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + ")";
}

attend::Inputs ProblemData::inputs() const {
  attend::Inputs in;
  in.q = q;
  in.k = k;
  in.v = v;
  if (bias.defined()) in.bias = bias;
  if (slopes.defined()) in.alibi_slopes = slopes;
  if (sinks.defined()) in.sinks = sinks;
  if (cu_seqlens_q.defined()) in.cu_seqlens_q = cu_seqlens_q;
  if (cu_seqlens_kv.defined()) in.cu_seqlens_kv = cu_seqlens_kv;
  if (cache) cache->bind(in);
  return in;
}

ProblemData make_data(const Problem& p, const DataSources& src) {
  const AttentionSpec& s = p.spec;
  ProblemData d;
  d.q = input(src.q, "q", s.dtype, q_shape(s), src.seed, 1);
  if (s.paged()) {
    fill_kv_cache(p, src, d);
  } else {
    d.k = input(src.k, "k", s.dtype, k_shape(s), src.seed, 2);
    d.v = input(src.v, "v", s.dtype, v_shape(s), src.seed, 3);
  }
  if (src.need_dout)
    d.dout = input(src.dout, "dout", attend::expected_dtype(s, attend::Role::dout), out_shape(s), src.seed, 4);
  if (s.has_bias) {
    d.bias = zeros(s.dtype, {p.bias_batch, p.bias_heads, s.seqlen_q, s.seqlen_kv});
    fill_normal(d.bias, src.seed, 5);
  }
  if (s.alibi && src.slopes.tensor.defined()) {
    const Shape got = view_shape(src.slopes.tensor.view());
    if (got != Shape{s.heads_q} && got != Shape{s.batch, s.heads_q}) {
      throw attend::Error(attend::ErrorCode::shape_mismatch, "alibi_slopes", src.slopes.path + ": " + shape_string(got),
                          "ALiBi slopes are (" + std::to_string(s.heads_q) + ") or (" + std::to_string(s.batch) + ", " +
                              std::to_string(s.heads_q) + ")");
    }
    d.slopes = load_checked(src.slopes, "alibi_slopes", DType::f32, got);
  } else if (s.alibi) {
    // Random positive slopes around 0.25, the magnitude of ALiBi's first heads.
    d.slopes = zeros(DType::f32, {s.heads_q});
    fill_normal(d.slopes, src.seed, 6, 0.25, 0.05);
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      d.slopes.as<float>()[h] = std::fabs(d.slopes.as<float>()[h]);
    }
  }
  if (s.softmax_type == attend::SoftmaxType::learnable) {
    d.sinks = input(src.sinks, "sinks", s.lse_dtype(), {s.heads_q}, src.seed, 7);
  } else if (src.sinks.tensor.defined()) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--sinks", src.sinks.path,
                        "sink logits need --softmax-type learnable");
  }
  if (s.varlen()) {
    d.cu_seqlens_q = cu_seqlens(p.lens_q, "cu_seqlens_q");
    d.cu_seqlens_kv = cu_seqlens(p.lens_kv, "cu_seqlens_kv");
  }
  return d;
}

}  // namespace attend_cli
