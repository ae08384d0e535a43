// The paged KV cache and forward_with_kvcache.
#include "attend/kvcache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attend/error.h"
#include "kernel/half.h"
#include "kernel/quant8.h"
#include "runtime/checked.h"

namespace attend {

namespace {

[[noreturn]] void invalid(std::string field, std::string value, std::string detail, std::string limit = {}) {
  throw Error(ErrorCode::invalid_argument, std::move(field), std::move(value), std::move(detail), std::move(limit));
}

std::string dims(std::initializer_list<std::int64_t> d) {
  std::string s = "(";
  for (auto it = d.begin(); it != d.end(); ++it) s += (it == d.begin() ? "" : ", ") + std::to_string(*it);
  return s + ")";
}

// dtype, shape, strides and pointer of a tensor the cache will read.
void check_tensor(const char* name, const TensorView& t, DType dtype, std::initializer_list<std::int64_t> shape) {
  if (t.dtype != dtype) {
    invalid(std::string(name) + ".dtype", std::string(to_string(t.dtype)), "expected " + std::string(to_string(dtype)));
  }
  bool ok = t.ndim == static_cast<int>(shape.size());
  for (int d = 0; ok && d < t.ndim; ++d) ok = t.shape[d] == shape.begin()[d];
  if (!ok)
    throw Error(ErrorCode::shape_mismatch, std::string(name) + ".shape", t.shape_string(), "expected " + dims(shape));
  std::int64_t extent = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.strides[d] < 0)
      invalid(std::string(name) + ".strides", std::to_string(t.strides[d]), "strides must be non-negative");
    if (t.shape[d] == 0) return;  // empty: nothing will be read
    extent = detail::checked_add(extent, detail::checked_mul(t.shape[d] - 1, t.strides[d], name), name);
  }
  (void)detail::checked_bytes(detail::checked_add(extent, 1, name), size_of(dtype), name);
  if (t.ndim > 0 && t.shape[t.ndim - 1] > 1 && t.strides[t.ndim - 1] != 1) {
    invalid(std::string(name) + ".strides", std::to_string(t.strides[t.ndim - 1]),
            "the last dimension must be contiguous");
  }
  if (t.data == nullptr) invalid(std::string(name) + ".data", "null", "null pointer for a non-empty tensor");
}

// Element d of a row of `dtype` (f32, bf16, f16 or f64) as f32.
float load_f32(const std::byte* row, DType dtype, std::int64_t d) {
  switch (dtype) {
    case DType::bf16: return detail::to_f32(reinterpret_cast<const detail::bf16_t*>(row)[d]);
    case DType::f16: return detail::to_f32(reinterpret_cast<const detail::f16_t*>(row)[d]);
    case DType::f64: return static_cast<float>(reinterpret_cast<const double*>(row)[d]);
    default: return reinterpret_cast<const float*>(row)[d];
  }
}

// max |x| over a row; NaN when some element is not finite.
template <class E>
float amax_of(const E* row, std::int64_t n) {
  float m = 0.0f;
  bool finite = true;
  for (std::int64_t d = 0; d < n; ++d) {
    const float x = detail::to_f32(row[d]);
    finite &= std::isfinite(x);
    m = std::max(m, std::fabs(x));
  }
  return finite ? m : std::numeric_limits<float>::quiet_NaN();
}

float row_amax(const std::byte* row, DType dtype, std::int64_t n) {
  switch (dtype) {
    case DType::bf16: return amax_of(reinterpret_cast<const detail::bf16_t*>(row), n);
    case DType::f16: return amax_of(reinterpret_cast<const detail::f16_t*>(row), n);
    default: return amax_of(reinterpret_cast<const float*>(row), n);
  }
}

template <class T, class E>
void quantize_row_as(const E* src, std::int64_t n, float scale, T* dst) {
  for (std::int64_t d = 0; d < n; ++d) dst[d] = detail::quantize<T>(detail::to_f32(src[d]), scale);
}

template <class T>
void quantize_row_to(const std::byte* src, DType dtype, std::int64_t n, float scale, std::byte* dst) {
  T* out = reinterpret_cast<T*>(dst);
  switch (dtype) {
    case DType::bf16: quantize_row_as(reinterpret_cast<const detail::bf16_t*>(src), n, scale, out); return;
    case DType::f16: quantize_row_as(reinterpret_cast<const detail::f16_t*>(src), n, scale, out); return;
    default: quantize_row_as(reinterpret_cast<const float*>(src), n, scale, out); return;
  }
}

// dst[0, n) = the codes of src[0, n) / scale (rounded to nearest even, saturated).
void quantize_row(const std::byte* src, DType dtype, std::int64_t n, float scale, DType kv, std::byte* dst) {
  switch (kv) {
    case DType::fp8_e4m3: quantize_row_to<detail::fp8_e4m3_t>(src, dtype, n, scale, dst); return;
    case DType::fp8_e5m2: quantize_row_to<detail::fp8_e5m2_t>(src, dtype, n, scale, dst); return;
    default: quantize_row_to<std::int8_t>(src, dtype, n, scale, dst); return;
  }
}

float code_max(DType kv) {
  return kv == DType::fp8_e4m3 ? detail::kFp8E4m3Max : kv == DType::fp8_e5m2 ? detail::kFp8E5m2Max : detail::kInt8Max;
}

// A per_head / per_tensor scale leaves room for values up to this many times
// the first append's largest before they saturate.
constexpr float kScaleHeadroom = 2.0f;

}  // namespace

KVCache::KVCache(const KVCacheConfig& c) : config_(c) {
  const auto positive = [](std::int64_t v, const char* field) {
    if (v < 1) invalid(field, std::to_string(v), "must be at least 1");
  };
  positive(c.batch, "KVCacheConfig.batch");
  positive(c.heads_kv, "KVCacheConfig.heads_kv");
  positive(c.head_dim_qk, "KVCacheConfig.head_dim_qk");
  positive(c.head_dim_v, "KVCacheConfig.head_dim_v");
  positive(c.max_seqlen, "KVCacheConfig.max_seqlen");
  positive(c.page_size, "KVCacheConfig.page_size");
  if ((c.page_size & (c.page_size - 1)) != 0) {
    invalid("KVCacheConfig.page_size", std::to_string(c.page_size), "must be a power of two");
  }
  if (c.dtype == DType::i32 || is_kv8(c.dtype)) {
    invalid("KVCacheConfig.dtype", std::string(to_string(c.dtype)),
            is_kv8(c.dtype)
                ? "the dtype of appended K/V and queries must be f32, bf16 or f16: an 8-bit cache sets kv_dtype"
                : "K/V pages must be floating point (f32, bf16, f16, f64)");
  }
  if (c.kv_dtype && *c.kv_dtype != c.dtype) {
    const bool wide = c.dtype == DType::f32 || c.dtype == DType::bf16 || c.dtype == DType::f16;
    if (!is_kv8(*c.kv_dtype) || !wide) {
      invalid("KVCacheConfig.kv_dtype", std::string(to_string(*c.kv_dtype)),
              "must equal dtype, or be fp8_e4m3, fp8_e5m2 or i8 with dtype f32, bf16 or f16");
    }
  }
  if (is_kv8(c.page_dtype())) {
    scale_ = c.kv_scale.value_or(c.page_dtype() == DType::i8 ? KVScale::per_token : KVScale::per_head);
    if (scale_ == KVScale::none) {
      invalid("KVCacheConfig.kv_scale", "none", "an 8-bit cache keeps scales: per_token, per_head or per_tensor");
    }
  } else if (c.kv_scale && *c.kv_scale != KVScale::none) {
    invalid("KVCacheConfig.kv_scale", std::string(to_string(*c.kv_scale)), "scales need an 8-bit kv_dtype");
  }
  if (c.num_pages < 0)
    invalid("KVCacheConfig.num_pages", std::to_string(c.num_pages), "must be >= 0 (0: enough for every sequence)");
  pages_per_seq_ = detail::ceil_div(c.max_seqlen, c.page_size);
  if (config_.num_pages == 0)
    config_.num_pages = detail::checked_mul(c.batch, pages_per_seq_, "KVCacheConfig.num_pages");
  constexpr std::int64_t kMaxId = std::numeric_limits<std::int32_t>::max();
  if (config_.num_pages > kMaxId || pages_per_seq_ * c.page_size > kMaxId) {
    invalid("KVCacheConfig.num_pages", std::to_string(config_.num_pages), "page ids and token counts must fit in int32",
            std::to_string(kMaxId));
  }
  const std::int64_t np = config_.num_pages;
  k_ = Tensor::zeros(c.page_dtype(), {np, c.page_size, c.heads_kv, c.head_dim_qk});
  v_ = Tensor::zeros(c.page_dtype(), {np, c.page_size, c.heads_kv, c.head_dim_v});
  if (scale_ != KVScale::none) {
    const auto ones = [&](std::initializer_list<std::int64_t> shape) {
      Tensor t = Tensor::zeros(DType::f32, shape);
      std::fill_n(t.as<float>(), t.numel(), 1.0f);
      return t;
    };
    if (scale_ == KVScale::per_token) {
      k_scale_ = ones({np, c.page_size, c.heads_kv});
      v_scale_ = ones({np, c.page_size, c.heads_kv});
    } else if (scale_ == KVScale::per_head) {
      k_scale_ = ones({c.batch, c.heads_kv});
      v_scale_ = ones({c.batch, c.heads_kv});
      scale_set_.assign(static_cast<std::size_t>(c.batch * c.heads_kv * 2), 0);
    } else {
      k_scale_ = ones({1});
      v_scale_ = ones({1});
      scale_set_.assign(2, 0);
    }
  }
  table_ = Tensor::zeros(DType::i32, {c.batch, pages_per_seq_});
  std::fill_n(table_.as<std::int32_t>(), table_.numel(), -1);
  seqlens_ = Tensor::zeros(DType::i32, {c.batch});
  leftpads_ = Tensor::zeros(DType::i32, {c.batch});
  pages_.resize(static_cast<std::size_t>(c.batch));
  free_.reserve(static_cast<std::size_t>(np));
  for (std::int64_t p = np - 1; p >= 0; --p) free_.push_back(static_cast<std::int32_t>(p));
}

void KVCache::check_seq(std::int64_t seq, const char* field) const {
  if (seq < 0 || seq >= config_.batch) {
    invalid(field, std::to_string(seq), "sequence id out of range [0, " + std::to_string(config_.batch) + ")",
            std::to_string(config_.batch - 1));
  }
}

std::int64_t KVCache::length(std::int64_t seq) const {
  check_seq(seq, "seq");
  return seqlens_.as<std::int32_t>()[seq];
}

std::int64_t KVCache::leftpad(std::int64_t seq) const {
  check_seq(seq, "seq");
  return leftpads_.as<std::int32_t>()[seq];
}

bool KVCache::has_leftpad() const {
  const auto* lp = leftpads_.as<const std::int32_t>();
  return std::any_of(lp, lp + config_.batch, [](std::int32_t x) { return x > 0; });
}

void KVCache::write_tokens(std::int64_t seq, const std::byte* k, std::int64_t ks, std::int64_t kh, const std::byte* v,
                           std::int64_t vs, std::int64_t vh, std::int64_t n) {
  const KVCacheConfig& c = config_;
  auto& pages = pages_[static_cast<std::size_t>(seq)];
  std::int32_t& len = seqlens_.as<std::int32_t>()[seq];
  // Pool strides of the contiguous page tensors; everything below in bytes.
  const auto esz = static_cast<std::int64_t>(size_of(c.dtype));
  const auto psz = static_cast<std::int64_t>(size_of(c.page_dtype()));
  const std::int64_t krow = c.heads_kv * c.head_dim_qk, vrow = c.heads_kv * c.head_dim_v;
  const auto kbytes = static_cast<std::size_t>(c.head_dim_qk * esz),
             vbytes = static_cast<std::size_t>(c.head_dim_v * esz);
  const DType kv = c.page_dtype();
  for (std::int64_t t = 0; t < n; ++t, ++len) {
    const std::int64_t slot = len / c.page_size;
    if (slot == static_cast<std::int64_t>(pages.size())) {
      pages.push_back(free_.back());  // append() checked that enough pages are free
      free_.pop_back();
      table_.as<std::int32_t>()[seq * pages_per_seq_ + slot] = pages.back();
    }
    const std::int64_t row = pages[static_cast<std::size_t>(slot)] * c.page_size + len % c.page_size;
    std::byte* kd = static_cast<std::byte*>(k_.data()) + row * krow * psz;
    std::byte* vd = static_cast<std::byte*>(v_.data()) + row * vrow * psz;
    for (std::int64_t h = 0; h < c.heads_kv; ++h) {
      const std::byte* ksrc = k + (t * ks + h * kh) * esz;
      const std::byte* vsrc = v + (t * vs + h * vh) * esz;
      if (scale_ == KVScale::none) {
        std::memcpy(kd + h * c.head_dim_qk * esz, ksrc, kbytes);
        std::memcpy(vd + h * c.head_dim_v * esz, vsrc, vbytes);
        continue;
      }
      float* kscale = scale_at(k_scale_, seq, row, h);
      float* vscale = scale_at(v_scale_, seq, row, h);
      if (scale_ == KVScale::per_token) {
        const float ka = row_amax(ksrc, c.dtype, c.head_dim_qk), va = row_amax(vsrc, c.dtype, c.head_dim_v);
        *kscale = ka > 0.0f ? ka / code_max(kv) : 1.0f;
        *vscale = va > 0.0f ? va / code_max(kv) : 1.0f;
      }
      quantize_row(ksrc, c.dtype, c.head_dim_qk, *kscale, kv, kd + h * c.head_dim_qk);
      quantize_row(vsrc, c.dtype, c.head_dim_v, *vscale, kv, vd + h * c.head_dim_v);
    }
  }
}

float* KVCache::scale_at(const Tensor& scales, std::int64_t seq, std::int64_t row, std::int64_t h) const {
  switch (scale_) {
    case KVScale::per_token: return scales.as<float>() + row * config_.heads_kv + h;
    case KVScale::per_head: return scales.as<float>() + seq * config_.heads_kv + h;
    default: return scales.as<float>();
  }
}

void KVCache::prepare_quantized(std::span<const AppendRows> rows, std::int64_t first_seq, bool batched) {
  if (scale_ == KVScale::none) return;
  const KVCacheConfig& c = config_;
  const auto esz = static_cast<std::int64_t>(size_of(c.dtype));
  const float cmax = code_max(c.page_dtype());
  // Largest |x| per (sequence, kv head) and side (K, V), checking finiteness first.
  std::vector<float> amax(rows.size() * static_cast<std::size_t>(c.heads_kv) * 2, 0.0f);
  for (std::size_t b = 0; b < rows.size(); ++b) {
    const AppendRows& r = rows[b];
    for (std::int64_t t = 0; t < r.n; ++t) {
      for (std::int64_t h = 0; h < c.heads_kv; ++h) {
        for (int side = 0; side < 2; ++side) {
          const std::byte* row = side == 0 ? r.k + (t * r.ks + h * r.kh) * esz : r.v + (t * r.vs + h * r.vh) * esz;
          const std::int64_t dim = side == 0 ? c.head_dim_qk : c.head_dim_v;
          const float a = row_amax(row, c.dtype, dim);
          if (std::isnan(a)) {
            std::int64_t d = 0;
            while (std::isfinite(load_f32(row, c.dtype, d))) ++d;
            const std::string where = (batched ? "[" + std::to_string(b) + "]" : std::string()) + "[" +
                                      std::to_string(t) + "][" + std::to_string(h) + "][" + std::to_string(d) + "]";
            invalid(std::string(side == 0 ? "k" : "v") + where, std::to_string(load_f32(row, c.dtype, d)),
                    "an 8-bit " + std::string(to_string(c.page_dtype())) +
                        " cache holds finite values only (no code for inf or NaN)");
          }
          float& m = amax[(b * static_cast<std::size_t>(c.heads_kv) + static_cast<std::size_t>(h)) * 2 + side];
          m = std::max(m, a);
        }
      }
    }
  }
  // Nothing has been written: fix the scales this append's values set.
  const auto fix = [&](char& set, float* scale, float a) {
    if (set || a == 0.0f) return;
    *scale = kScaleHeadroom * a / cmax;
    set = 1;
  };
  if (scale_ == KVScale::per_head) {
    for (std::size_t b = 0; b < rows.size(); ++b) {
      const std::int64_t seq = first_seq + static_cast<std::int64_t>(b);
      for (std::int64_t h = 0; h < c.heads_kv; ++h) {
        const std::size_t i = (b * static_cast<std::size_t>(c.heads_kv) + static_cast<std::size_t>(h)) * 2;
        const std::size_t f = static_cast<std::size_t>(seq * c.heads_kv + h) * 2;
        fix(scale_set_[f], k_scale_.as<float>() + seq * c.heads_kv + h, amax[i]);
        fix(scale_set_[f + 1], v_scale_.as<float>() + seq * c.heads_kv + h, amax[i + 1]);
      }
    }
  } else if (scale_ == KVScale::per_tensor) {
    float ka = 0.0f, va = 0.0f;
    for (std::size_t i = 0; i < amax.size(); i += 2) {
      ka = std::max(ka, amax[i]);
      va = std::max(va, amax[i + 1]);
    }
    fix(scale_set_[0], k_scale_.as<float>(), ka);
    fix(scale_set_[1], v_scale_.as<float>(), va);
  }
}

void KVCache::set_scales(std::int64_t seq, std::span<const float> k_scale, std::span<const float> v_scale) {
  const KVCacheConfig& c = config_;
  if (scale_ != KVScale::per_head && scale_ != KVScale::per_tensor) {
    invalid("kv_scale", std::string(to_string(scale_)), "set_scales needs a per_head or per_tensor 8-bit cache");
  }
  const std::size_t n = scale_ == KVScale::per_head ? static_cast<std::size_t>(c.heads_kv) : 1;
  for (const auto& [name, span] : {std::pair{"k_scale", k_scale}, std::pair{"v_scale", v_scale}}) {
    if (span.size() != n) invalid(name, std::to_string(span.size()) + " entries", "expected " + std::to_string(n));
    for (std::size_t i = 0; i < n; ++i) {
      if (!(std::isfinite(span[i]) && span[i] > 0.0f)) {
        invalid(std::string(name) + "[" + std::to_string(i) + "]", std::to_string(span[i]), "must be finite and > 0");
      }
    }
  }
  if (scale_ == KVScale::per_head) {
    check_seq(seq, "seq");
    if (length(seq) > 0) {
      invalid("seq", std::to_string(seq),
              "holds " + std::to_string(length(seq)) + " tokens quantized with its present scales: reset() it first");
    }
    for (std::size_t h = 0; h < n; ++h) {
      k_scale_.as<float>()[seq * c.heads_kv + static_cast<std::int64_t>(h)] = k_scale[h];
      v_scale_.as<float>()[seq * c.heads_kv + static_cast<std::int64_t>(h)] = v_scale[h];
      scale_set_[static_cast<std::size_t>(seq * c.heads_kv) * 2 + 2 * h] = 1;
      scale_set_[static_cast<std::size_t>(seq * c.heads_kv) * 2 + 2 * h + 1] = 1;
    }
    return;
  }
  for (std::int64_t b = 0; b < c.batch; ++b) {
    if (length(b) > 0) {
      invalid("seq", std::to_string(b), "holds tokens quantized with the present per-tensor scale");
    }
  }
  k_scale_.as<float>()[0] = k_scale[0];
  v_scale_.as<float>()[0] = v_scale[0];
  scale_set_[0] = scale_set_[1] = 1;
}

void KVCache::append(const TensorView& k, const TensorView& v, std::span<const std::int64_t> counts) {
  const KVCacheConfig& c = config_;
  const std::int64_t s_new = k.ndim == 4 ? k.shape[1] : 0;
  check_tensor("k", k, c.dtype, {c.batch, s_new, c.heads_kv, c.head_dim_qk});
  check_tensor("v", v, c.dtype, {c.batch, s_new, c.heads_kv, c.head_dim_v});
  if (!counts.empty() && static_cast<std::int64_t>(counts.size()) != c.batch) {
    invalid("counts", std::to_string(counts.size()) + " entries", "needs one count per sequence",
            std::to_string(c.batch));
  }
  // Check everything before writing anything: a failed append changes nothing.
  std::int64_t need_pages = 0;
  for (std::int64_t b = 0; b < c.batch; ++b) {
    const std::int64_t n = counts.empty() ? s_new : counts[static_cast<std::size_t>(b)];
    const std::string field = "counts[" + std::to_string(b) + "]";
    if (n < 0 || n > s_new) invalid(field, std::to_string(n), "must lie in [0, S_new]", std::to_string(s_new));
    const std::int64_t len = seqlens_.as<std::int32_t>()[b];
    if (len + n > capacity()) {
      invalid(field, std::to_string(n),
              "append past capacity: sequence " + std::to_string(b) + " holds " + std::to_string(len) + " of " +
                  std::to_string(capacity()) + " tokens",
              std::to_string(capacity() - len));
    }
    need_pages +=
        detail::ceil_div(len + n, c.page_size) - static_cast<std::int64_t>(pages_[static_cast<std::size_t>(b)].size());
  }
  if (need_pages > free_pages()) {
    invalid("k", k.shape_string(),
            "append needs " + std::to_string(need_pages) + " new pages, the pool has " + std::to_string(free_pages()) +
                " free",
            std::to_string(free_pages()));
  }
  const auto esz = static_cast<std::int64_t>(size_of(c.dtype));
  if (quantized()) {
    std::vector<AppendRows> rows;
    for (std::int64_t b = 0; b < c.batch; ++b) {
      rows.push_back({static_cast<const std::byte*>(k.data) + b * k.strides[0] * esz,
                      static_cast<const std::byte*>(v.data) + b * v.strides[0] * esz, k.strides[1], k.strides[2],
                      v.strides[1], v.strides[2], counts.empty() ? s_new : counts[static_cast<std::size_t>(b)]});
    }
    prepare_quantized(rows, 0, true);
  }
  for (std::int64_t b = 0; b < c.batch; ++b) {
    const std::int64_t n = counts.empty() ? s_new : counts[static_cast<std::size_t>(b)];
    write_tokens(b, static_cast<const std::byte*>(k.data) + b * k.strides[0] * esz, k.strides[1], k.strides[2],
                 static_cast<const std::byte*>(v.data) + b * v.strides[0] * esz, v.strides[1], v.strides[2], n);
  }
}

void KVCache::append(std::int64_t seq, const TensorView& k, const TensorView& v) {
  check_seq(seq, "seq");
  const KVCacheConfig& c = config_;
  const std::int64_t n = k.ndim == 3 ? k.shape[0] : 0;
  check_tensor("k", k, c.dtype, {n, c.heads_kv, c.head_dim_qk});
  check_tensor("v", v, c.dtype, {n, c.heads_kv, c.head_dim_v});
  const std::int64_t len = seqlens_.as<std::int32_t>()[seq];
  if (len + n > capacity()) {
    invalid("k.shape[0]", std::to_string(n),
            "append past capacity: sequence " + std::to_string(seq) + " holds " + std::to_string(len) + " of " +
                std::to_string(capacity()) + " tokens",
            std::to_string(capacity() - len));
  }
  const std::int64_t need =
      detail::ceil_div(len + n, c.page_size) - static_cast<std::int64_t>(pages_[static_cast<std::size_t>(seq)].size());
  if (need > free_pages()) {
    invalid(
        "k.shape[0]", std::to_string(n),
        "append needs " + std::to_string(need) + " new pages, the pool has " + std::to_string(free_pages()) + " free",
        std::to_string(free_pages()));
  }
  if (quantized()) {
    const AppendRows rows{static_cast<const std::byte*>(k.data),
                          static_cast<const std::byte*>(v.data),
                          k.strides[0],
                          k.strides[1],
                          v.strides[0],
                          v.strides[1],
                          n};
    prepare_quantized({&rows, 1}, seq, false);
  }
  write_tokens(seq, static_cast<const std::byte*>(k.data), k.strides[0], k.strides[1],
               static_cast<const std::byte*>(v.data), v.strides[0], v.strides[1], n);
}

void KVCache::set_leftpad(std::int64_t seq, std::int64_t tokens) {
  check_seq(seq, "seq");
  if (tokens < 0 || tokens > capacity()) {
    invalid("leftpad", std::to_string(tokens), "must lie in [0, capacity]", std::to_string(capacity()));
  }
  leftpads_.as<std::int32_t>()[seq] = static_cast<std::int32_t>(tokens);
}

void KVCache::reset(std::int64_t seq) {
  check_seq(seq, "seq");
  auto& pages = pages_[static_cast<std::size_t>(seq)];
  // Returned in reverse so the next sequence to grow takes them in the same order.
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) free_.push_back(*it);
  pages.clear();
  std::fill_n(table_.as<std::int32_t>() + seq * pages_per_seq_, pages_per_seq_, -1);
  seqlens_.as<std::int32_t>()[seq] = 0;
  leftpads_.as<std::int32_t>()[seq] = 0;
  if (scale_ == KVScale::per_head) {
    std::fill_n(k_scale_.as<float>() + seq * config_.heads_kv, config_.heads_kv, 1.0f);
    std::fill_n(v_scale_.as<float>() + seq * config_.heads_kv, config_.heads_kv, 1.0f);
    std::fill_n(scale_set_.begin() + seq * config_.heads_kv * 2, config_.heads_kv * 2, 0);
  }
}

KVCacheProblem kvcache_problem(const TensorView& q, const KVCache& cache, const AttentionSpec& spec,
                               const TensorView& alibi_slopes, const TensorView& sinks) {
  if (spec.varlen()) invalid("layout", "thd", "queries over a KV cache must be dense: bshd, bhsd or sbhd");
  if (spec.has_bias) invalid("has_bias", "true", "forward_with_kvcache takes no bias");
  if (q.ndim != 4)
    throw Error(ErrorCode::shape_mismatch, "q.shape", q.shape_string(), "expected 4 dims in the spec's layout");
  const KVCacheConfig& c = cache.config();
  KVCacheProblem p;
  AttentionSpec& s = p.spec;
  s = spec;
  // (B, Sq, H, D) in the spec's layout.
  const bool bhsd = spec.layout == Layout::bhsd, sbhd = spec.layout == Layout::sbhd;
  const std::int64_t qb = sbhd ? q.shape[1] : q.shape[0];
  s.seqlen_q = bhsd ? q.shape[2] : (sbhd ? q.shape[0] : q.shape[1]);
  s.heads_q = bhsd ? q.shape[1] : q.shape[2];
  if (qb != c.batch) {
    throw Error(ErrorCode::shape_mismatch, "q.shape", q.shape_string(),
                "batch " + std::to_string(qb) + " differs from the cache's " + std::to_string(c.batch));
  }
  if (q.shape[3] != c.head_dim_qk) {
    throw Error(ErrorCode::shape_mismatch, "q.shape[3]", std::to_string(q.shape[3]),
                "head_dim_qk differs from the cache's " + std::to_string(c.head_dim_qk));
  }
  if (s.seqlen_q < 1) invalid("q.shape", q.shape_string(), "needs at least one query per sequence");
  s.batch = c.batch;
  s.dtype = c.dtype;  // q must match it: validate_inputs names q.dtype otherwise
  s.kv_dtype = c.kv_dtype;
  s.kv_scale = cache.scale_layout();
  s.dq_dtype.reset();
  s.heads_kv = c.heads_kv;
  s.head_dim_qk = c.head_dim_qk;
  s.head_dim_v = c.head_dim_v;
  s.total_q = s.total_kv = 0;
  s.kv_page_size = c.page_size;
  s.kv_leftpad = cache.has_leftpad();
  s.seqlen_kv = 0;
  for (std::int64_t b = 0; b < c.batch; ++b) s.seqlen_kv = std::max(s.seqlen_kv, cache.length(b) - cache.leftpad(b));
  p.inputs.q = q;
  cache.bind(p.inputs);
  if (s.alibi) p.inputs.alibi_slopes = alibi_slopes;
  if (s.softmax_type == SoftmaxType::learnable) p.inputs.sinks = sinks;
  validate_inputs(s, p.inputs);
  return p;
}

void KVCache::bind(Inputs& in) const {
  in.k = k_;
  in.v = v_;
  in.block_table = table_;
  in.cache_seqlens = seqlens_;
  if (has_leftpad()) in.cache_leftpad = leftpads_;
  if (scale_ != KVScale::none) {
    in.k_scale = k_scale_;
    in.v_scale = v_scale_;
  }
}

ForwardResult forward_with_kvcache(const TensorView& q, const KVCache& cache, const AttentionSpec& spec, Mode mode,
                                   const TensorView& alibi_slopes, const Policy* policy, const TensorView& sinks) {
  if (mode == Mode::training) {
    invalid("mode", "training",
            "forward_with_kvcache is inference-only: a KV cache holds no gradients (train with attend::forward "
            "on dense K/V)");
  }
  const KVCacheProblem p = kvcache_problem(q, cache, spec, alibi_slopes, sinks);
  return forward(p.inputs, p.spec, Mode::inference, policy);
}

}  // namespace attend
