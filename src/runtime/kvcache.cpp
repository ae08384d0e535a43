// The paged KV cache and forward_with_kvcache.
#include "attend/kvcache.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "attend/error.h"
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
  if (c.dtype == DType::i32)
    invalid("KVCacheConfig.dtype", "i32", "K/V pages must be floating point (f32, bf16, f16, f64)");
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
  k_ = Tensor::zeros(c.dtype, {np, c.page_size, c.heads_kv, c.head_dim_qk});
  v_ = Tensor::zeros(c.dtype, {np, c.page_size, c.heads_kv, c.head_dim_v});
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
  const std::int64_t krow = c.heads_kv * c.head_dim_qk, vrow = c.heads_kv * c.head_dim_v;
  const auto kbytes = static_cast<std::size_t>(c.head_dim_qk * esz),
             vbytes = static_cast<std::size_t>(c.head_dim_v * esz);
  for (std::int64_t t = 0; t < n; ++t, ++len) {
    const std::int64_t slot = len / c.page_size;
    if (slot == static_cast<std::int64_t>(pages.size())) {
      pages.push_back(free_.back());  // append() checked that enough pages are free
      free_.pop_back();
      table_.as<std::int32_t>()[seq * pages_per_seq_ + slot] = pages.back();
    }
    const std::int64_t row = pages[static_cast<std::size_t>(slot)] * c.page_size + len % c.page_size;
    std::byte* kd = static_cast<std::byte*>(k_.data()) + row * krow * esz;
    std::byte* vd = static_cast<std::byte*>(v_.data()) + row * vrow * esz;
    for (std::int64_t h = 0; h < c.heads_kv; ++h) {
      std::memcpy(kd + h * c.head_dim_qk * esz, k + (t * ks + h * kh) * esz, kbytes);
      std::memcpy(vd + h * c.head_dim_v * esz, v + (t * vs + h * vh) * esz, vbytes);
    }
  }
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
  for (std::int64_t b = 0; b < c.batch; ++b) {
    const std::int64_t n = counts.empty() ? s_new : counts[static_cast<std::size_t>(b)];
    const auto esz = static_cast<std::int64_t>(size_of(c.dtype));
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
