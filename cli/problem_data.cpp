#include "problem_data.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <span>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attend/device.h"
#include "attend/error.h"
#include "attend/kvcache.h"
#include "attend/npy.h"
#include "elements.h"
#include "kernel/philox.h"

// The block loops below are plain C++ that GCC vectorizes; compiled once per
// vector width and chosen at load time, they run 16 lanes wide where AVX-512
// is there. Results do not depend on the clone: every operation is a correctly
// rounded IEEE one, in the same order (the file is built without FP
// contraction).
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define ATTEND_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ATTEND_VECTOR_CLONES
#endif

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

// A block is kLanes Philox counters, 4 * kLanes elements: element j of block
// b (element 4 kLanes b + j of the tensor) is Box-Muller output j / kLanes of
// counter kLanes b + j % kLanes — planar, so that the loops read and write
// whole vectors. Changing kLanes changes the data.
constexpr std::int64_t kLanes = 64;
constexpr std::int64_t kBlock = 4 * kLanes;
// Elements per unit of work for the threads (a multiple of kBlock).
constexpr std::int64_t kChunk = 64 * kBlock;
// The counter's last word, so that these streams never meet dropout's
// (philox.h: counter (col/4, row, head, batch)) for one seed.
constexpr std::uint32_t kTag = 0x6e6f726du;  // "norm"

// ln x for x in (0, 1], Cephes' logf: x = 2^e m with m in [sqrt(1/2), sqrt(2)),
// ln m by its degree-9 polynomial in m - 1; about 1 ulp. Branch-free.
inline float log_unit(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  auto e = static_cast<float>(static_cast<std::int32_t>(bits >> 23) - 126);
  float m = std::bit_cast<float>((bits & 0x007fffffu) | 0x3f000000u);  // [0.5, 1)
  const bool low = m < 0.70710678118654752f;
  e = low ? e - 1.0f : e;
  m = low ? m + m - 1.0f : m - 1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = y - 2.12194440e-4f * e;
  y = y - 0.5f * z;
  return m + y + 0.693359375f * e;
}

// sin and cos of x in [-pi/4, pi/4] (Cephes' sinf/cosf polynomials).
inline float sin_small(float x) {
  const float z = x * x;
  return x + x * z * ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f);
}
inline float cos_small(float x) {
  const float z = x * x;
  return 1.0f - 0.5f * z + z * z * ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f);
}

// Two standard normals from two random words (Box-Muller): the radius from
// the first, u in (0, 1] on 24 bits; the angle's quadrant from the second's
// top 2 bits and its offset within the quadrant from 24 more, so that the
// polynomials see only [-pi/4, pi/4).
inline void box_muller(std::uint32_t a, std::uint32_t b, float& z0, float& z1) {
  const float u = static_cast<float>((a >> 8) + 1u) * 0x1p-24f;
  const float r = std::sqrt(-2.0f * log_unit(u));
  const float x = (static_cast<float>((b >> 6) & 0x00ffffffu) * 0x1p-24f - 0.5f) * 1.57079632679489662f;
  const std::uint32_t q = b >> 30;
  const float s = sin_small(x), c = cos_small(x);
  // The angle is q quarter turns + x: rotate (c, s) by q.
  const float cs = (q & 1u) ? -s : c, sn = (q & 1u) ? c : s;
  z0 = r * ((q & 2u) ? -cs : cs);
  z1 = r * ((q & 2u) ? -sn : sn);
}

ATTEND_VECTOR_CLONES void normal_block(std::uint64_t seed, std::uint32_t stream, std::uint64_t block, float* z) {
  std::uint32_t w[4][kLanes];
  const std::array<std::uint32_t, 2> key{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
  for (std::int64_t j = 0; j < kLanes; ++j) {
    const std::uint64_t c = block * kLanes + static_cast<std::uint64_t>(j);
    const auto r = attend::detail::philox4x32(
        {static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(c >> 32), stream, kTag}, key);
    w[0][j] = r[0];
    w[1][j] = r[1];
    w[2][j] = r[2];
    w[3][j] = r[3];
  }
  for (std::int64_t j = 0; j < kLanes; ++j) {
    box_muller(w[0][j], w[1][j], z[j], z[kLanes + j]);
    box_muller(w[2][j], w[3][j], z[2 * kLanes + j], z[3 * kLanes + j]);
  }
}

// Elements [0, n) of one block, scaled and rounded to the destination.
ATTEND_VECTOR_CLONES void store_f32(const float* z, std::int64_t n, float mean, float stddev, float* dst) {
  for (std::int64_t j = 0; j < n; ++j) dst[j] = mean + stddev * z[j];
}

ATTEND_VECTOR_CLONES void store_bf16(const float* z, std::int64_t n, float mean, float stddev, std::uint16_t* dst) {
  for (std::int64_t j = 0; j < n; ++j) {
    const auto u = std::bit_cast<std::uint32_t>(mean + stddev * z[j]);  // finite: no NaN case
    dst[j] = static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

ATTEND_VECTOR_CLONES void store_f64(const float* z, std::int64_t n, double mean, double stddev, double* dst) {
  for (std::int64_t j = 0; j < n; ++j) dst[j] = mean + stddev * static_cast<double>(z[j]);
}

void store_f16(const float* z, std::int64_t n, float mean, float stddev, std::uint16_t* dst) {
  for (std::int64_t j = 0; j < n; ++j) dst[j] = float_to_f16(mean + stddev * z[j]);
}

// Elements [begin, end) of the tensor (begin a multiple of kBlock).
void fill_range(void* data, DType dtype, std::int64_t begin, std::int64_t end, std::uint64_t seed, std::uint32_t stream,
                double mean, double stddev) {
  alignas(64) float z[kBlock];
  const auto fm = static_cast<float>(mean), fs = static_cast<float>(stddev);
  for (std::int64_t i = begin; i < end; i += kBlock) {
    const std::int64_t n = std::min(kBlock, end - i);
    normal_block(seed, stream, static_cast<std::uint64_t>(i / kBlock), z);
    switch (dtype) {
      case DType::f32: store_f32(z, n, fm, fs, static_cast<float*>(data) + i); break;
      case DType::bf16: store_bf16(z, n, fm, fs, static_cast<std::uint16_t*>(data) + i); break;
      case DType::f16: store_f16(z, n, fm, fs, static_cast<std::uint16_t*>(data) + i); break;
      case DType::f64: store_f64(z, n, mean, stddev, static_cast<double*>(data) + i); break;
      default:
        for (std::int64_t j = 0; j < n; ++j) store(data, dtype, i + j, mean + stddev * static_cast<double>(z[j]));
    }
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
  return normal_tensor(dtype, shape, seed, stream);
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
  // An 8-bit --kv-dtype: the appends quantize (make_problem fixed kv_scale).
  if (s.kv_quantized()) {
    c.kv_dtype = s.kv_dtype;
    c.kv_scale = s.kv_scale;
  }
  attend::KVCache cache(c);
  cache.append(d.k, d.v, p.cache_lens);  // empty: every sequence gets all `stored` (= seqlen_kv) tokens
  for (std::int64_t b = 0; b < s.batch; ++b) cache.set_leftpad(b, p.cache_pad(b));
  d.cache = std::make_shared<const attend::KVCache>(std::move(cache));
}

// Dense 8-bit K/V: each scale is max|x| / the largest code over the rows it
// scales (1 for all zeros, as attend::KVCache), so no element saturates and
// each group's largest is exact; kv_scale none stores x's codes unscaled.
void quantize_dense(const AttentionSpec& s, const Tensor& wide, const attend::TensorView& cu_seqlens_kv, Tensor& codes,
                    Tensor& scale) {
  const DType kv = s.effective_kv_dtype();
  const Shape shape = view_shape(wide.view());
  const std::int64_t dim = shape.back(), rows = wide.numel() / dim;
  codes = zeros(kv, shape);
  if (s.kv_scale == attend::KVScale::none) {
    for (std::int64_t i = 0; i < wide.numel(); ++i) store(codes.data(), kv, i, load(wide.data(), s.dtype, i));
    return;
  }
  const attend::Shape expected = attend::expected_shape(s, attend::Role::k_scale);  // outlives the span below
  const std::span<const std::int64_t> dims = expected.span();
  scale = zeros(DType::f32, Shape(dims.begin(), dims.end()));
  float* sc = scale.as<float>();
  const KVScaleIndex index(s, shape, cu_seqlens_kv, {});
  const double code_max = attend::kv8_value(kv, attend::kv8_code(kv, std::numeric_limits<float>::max()));
  std::vector<double> amax(static_cast<std::size_t>(scale.numel()), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    double& m = amax[static_cast<std::size_t>(index(r))];
    for (std::int64_t j = 0; j < dim; ++j) m = std::max(m, std::fabs(load(wide.data(), s.dtype, r * dim + j)));
  }
  for (std::int64_t i = 0; i < scale.numel(); ++i) {
    const double m = amax[static_cast<std::size_t>(i)];
    sc[i] = m > 0.0 ? static_cast<float>(m / code_max) : 1.0f;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const double g = sc[index(r)];
    for (std::int64_t j = 0; j < dim; ++j) {
      store(codes.data(), kv, r * dim + j, load(wide.data(), s.dtype, r * dim + j) / g);
    }
  }
}

}  // namespace

KVScaleIndex::KVScaleIndex(const AttentionSpec& s, const Shape& k_shape, const attend::TensorView& cu_seqlens_kv,
                           const attend::TensorView& block_table)
    : spec_(s), shape_(k_shape) {
  if (s.kv_scale != attend::KVScale::per_head) return;
  if (s.paged()) {
    seq_of_.assign(static_cast<std::size_t>(k_shape[0]), -1);
    const std::int64_t cols = block_table.shape[1];
    for (std::int64_t b = 0; b < block_table.shape[0]; ++b) {
      for (std::int64_t j = 0; j < cols; ++j) {
        const std::int32_t page = static_cast<const std::int32_t*>(block_table.data)[b * cols + j];
        if (page >= 0 && page < k_shape[0]) seq_of_[static_cast<std::size_t>(page)] = b;
      }
    }
  } else if (s.layout == attend::Layout::thd) {
    const auto* cu = static_cast<const std::int32_t*>(cu_seqlens_kv.data);
    seq_of_.assign(cu, cu + cu_seqlens_kv.numel());
  }
}

std::int64_t KVScaleIndex::operator()(std::int64_t row) const {
  const std::int64_t h_kv = spec_.heads_kv;
  switch (spec_.kv_scale) {
    case attend::KVScale::none:
    case attend::KVScale::per_tensor: return 0;
    case attend::KVScale::per_token: return row;
    case attend::KVScale::per_head: break;
  }
  std::int64_t b = 0, h = 0;
  if (spec_.paged()) {  // (pages, page_size, Hkv, D)
    h = row % h_kv;
    b = seq_of_[static_cast<std::size_t>(row / (shape_[1] * h_kv))];
    if (b < 0) return -1;
  } else {
    switch (spec_.layout) {
      case attend::Layout::bshd: h = row % h_kv, b = row / (shape_[1] * h_kv); break;
      case attend::Layout::bhsd: h = (row / shape_[2]) % h_kv, b = row / (shape_[1] * shape_[2]); break;
      case attend::Layout::sbhd: h = row % h_kv, b = (row / h_kv) % shape_[1]; break;
      case attend::Layout::thd: {
        h = row % h_kv;
        const auto it = std::upper_bound(seq_of_.begin(), seq_of_.end(), row / h_kv);
        b = std::max<std::int64_t>(0, (it - seq_of_.begin()) - 1);
        break;
      }
    }
  }
  return b * h_kv + h;
}

// Built without OpenMP (bench/ compiles this file on its own), one thread.
void fill_normal(const Tensor& t, std::uint64_t seed, std::uint32_t stream, double mean, double stddev,
                 [[maybe_unused]] int threads) {
  const std::int64_t n = t.numel(), chunks = (n + kChunk - 1) / kChunk;
  void* data = t.data();
  const DType dtype = t.view().dtype;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_get_max_threads();
  const int nt = static_cast<int>(std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(chunks, 1)));
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
  for (std::int64_t c = 0; c < chunks; ++c) {
    fill_range(data, dtype, c * kChunk, std::min(n, (c + 1) * kChunk), seed, stream, mean, stddev);
  }
}

Tensor normal_tensor(DType dtype, const Shape& shape, std::uint64_t seed, std::uint32_t stream, int threads) {
  Tensor t =
      Tensor::empty(dtype, std::span<const std::int64_t>(shape), attend::Device::cpu(), attend::host_allocator());
  fill_normal(t, seed, stream, 0.0, 1.0, threads);
  return t;
}

NpyInput read_npy_input(const std::string& path, std::string_view flag) {
  if (path.empty()) return {};
  try {
    return {path, attend::read_npy(path)};
  } catch (const attend::Error& e) {
    // read_npy calls the file "path" (open, read, not a regular file); the user gave it as a flag.
    if (e.field() != "path") throw;
    throw attend::Error(e.code(), std::string(flag), e.value(), e.detail(), e.limit());
  }
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
  if (k_scale.defined()) in.k_scale = k_scale;
  if (v_scale.defined()) in.v_scale = v_scale;
  if (cache) cache->bind(in);
  return in;
}

ProblemData make_data(const Problem& p, const DataSources& src) {
  const AttentionSpec& s = p.spec;
  ProblemData d;
  d.q = input(src.q, "q", s.dtype, q_shape(s), src.seed, 1);
  if (s.varlen()) {
    d.cu_seqlens_q = cu_seqlens(p.lens_q, "cu_seqlens_q");
    d.cu_seqlens_kv = cu_seqlens(p.lens_kv, "cu_seqlens_kv");
  }
  if (s.paged()) {
    fill_kv_cache(p, src, d);
  } else {
    d.k = input(src.k, "k", s.dtype, k_shape(s), src.seed, 2);
    d.v = input(src.v, "v", s.dtype, v_shape(s), src.seed, 3);
    if (s.kv_quantized()) {
      d.k_wide = d.k;
      d.v_wide = d.v;
      quantize_dense(s, d.k_wide, d.cu_seqlens_kv, d.k, d.k_scale);
      quantize_dense(s, d.v_wide, d.cu_seqlens_kv, d.v, d.v_scale);
    }
  }
  if (src.need_dout)
    d.dout = input(src.dout, "dout", attend::expected_dtype(s, attend::Role::dout), out_shape(s), src.seed, 4);
  if (s.has_bias) {
    d.bias = normal_tensor(s.dtype, {p.bias_batch, p.bias_heads, s.seqlen_q, s.seqlen_kv}, src.seed, 5);
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
  return d;
}

}  // namespace attend_cli
