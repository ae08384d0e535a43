// A paged KV cache for inference, and attention of new queries over it.
//
// Storage follows vLLM / FlashAttention's paged layout: K and V live in pools of
// pages, (num_pages, page_size, heads_kv, head_dim) in the cache's dtype (f32,
// bf16, f16 or f64; half precision halves the bytes decode reads; an 8-bit
// kv_dtype quarters them, see below), and each sequence owns
// a row of the block table listing its pages in token order. Pages are taken
// from the pool as sequences grow and returned by reset(). Token t of sequence
// b is row t % page_size of page block_table[b, t / page_size].
//
// Every bound is checked: a sequence id out of range, an append past a
// sequence's capacity or past the free pages, a malformed tensor — each is an
// attend::Error, and a failed append changes nothing. The cache never writes
// through the (user-visible) block table tensor: pages are tracked internally,
// so no edit of that tensor can make the cache write out of bounds, and
// forward validates every entry it will read.
//
// An 8-bit cache (kv_dtype fp8_e4m3, fp8_e5m2 or i8) stores codes; element =
// code * scale, f32 scales kept beside the pages (KVScale):
//   per_token (i8's default): scale = max|x| / code max over each (token, kv
//     head) row of the append (1 for an all-zero row) — the row's largest
//     element is exact and none saturates;
//   per_head (fp8's default; FlashAttention 3's descale): one scale per
//     (sequence, kv head), fixed by set_scales() or else by the first append
//     that brings a non-zero value to it: 2 * max|x| / code max over that
//     append's tokens, so later tokens up to twice as large still fit; larger
//     ones saturate at the largest code (documented, never inf or NaN);
//   per_tensor: one scale for everything, fixed likewise by set_scales() or
//     the first non-zero append over all of its rows.
// Appends take K/V in `dtype` (f32, bf16 or f16), round to nearest even and
// refuse a non-finite element by name (no 8-bit code holds it), before
// anything is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "attend/attention.h"
#include "attend/select.h"
#include "attend/spec.h"
#include "attend/tensor.h"

namespace attend {

struct KVCacheConfig {
  std::int64_t batch = 1;        // sequences
  std::int64_t heads_kv = 1;     // GQA: query heads (given at forward) must be a multiple
  std::int64_t head_dim_qk = 64;
  std::int64_t head_dim_v = 64;
  std::int64_t max_seqlen = 0;   // tokens one sequence can hold (rounded up to whole pages)
  std::int64_t page_size = 64;   // tokens per page: a power of two >= 1
  std::int64_t num_pages = 0;    // pages in the pool; 0: batch * ceil(max_seqlen / page_size)
  DType dtype = DType::f32;      // of appended K/V and of the queries at forward; of the pages unless kv_dtype
  // The pages' dtype when it differs: fp8_e4m3, fp8_e5m2 or i8 (dtype f32, bf16 or f16).
  std::optional<DType> kv_dtype{};
  // An 8-bit cache's scale layout (none excluded); unset: per_token for i8, per_head for fp8.
  std::optional<KVScale> kv_scale{};
  DType page_dtype() const { return kv_dtype.value_or(dtype); }
};

class KVCache {
 public:
  // Throws attend::Error for a non-positive size, a page size that is not a
  // power of two, a pool whose page ids do not fit in int32, or an i32 dtype.
  explicit KVCache(const KVCacheConfig& config);

  const KVCacheConfig& config() const { return config_; }
  std::int64_t batch() const { return config_.batch; }
  std::int64_t page_size() const { return config_.page_size; }
  std::int64_t pages_per_sequence() const { return pages_per_seq_; }
  std::int64_t capacity() const { return pages_per_seq_ * config_.page_size; }  // tokens per sequence
  std::int64_t free_pages() const { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t length(std::int64_t seq) const;   // tokens stored, left padding included
  std::int64_t leftpad(std::int64_t seq) const;  // leading tokens that are padding
  bool has_leftpad() const;                      // some sequence has leftpad > 0

  // Appends tokens to every sequence. k: (B, S_new, heads_kv, head_dim_qk) and
  // v: (B, S_new, heads_kv, head_dim_v), in the cache's dtype (no silent
  // conversion: a mismatch is an error), any non-negative strides with a
  // contiguous last dim. counts[b] <= S_new appends only the first counts[b]
  // tokens of row b (sequences may grow by different amounts); an empty span
  // appends all S_new to each. All or nothing.
  void append(const TensorView& k, const TensorView& v, std::span<const std::int64_t> counts = {});
  // Appends n tokens to one sequence: k (n, heads_kv, head_dim_qk), v (n, heads_kv, head_dim_v).
  void append(std::int64_t seq, const TensorView& k, const TensorView& v);
  // The first `tokens` positions of seq are padding: never attended, and masks
  // and ALiBi count keys from the first real token (FlashAttention's cache_leftpad).
  void set_leftpad(std::int64_t seq, std::int64_t tokens);
  // Empties seq (length and left padding 0) and returns its pages to the pool
  // (a per_head cache forgets seq's scales).
  void reset(std::int64_t seq);
  // Fixes the scales of an 8-bit cache before its values arrive: per_head,
  // heads_kv entries each for sequence seq, which must be empty; per_tensor, one
  // entry each, while every sequence is empty (seq is ignored). Finite, > 0.
  void set_scales(std::int64_t seq, std::span<const float> k_scale, std::span<const float> v_scale);
  bool quantized() const { return is_kv8(config_.page_dtype()); }
  KVScale scale_layout() const { return scale_; }  // none unless quantized()

  // The storage, in the form attend::Inputs takes for spec.kv_page_size = page_size().
  const Tensor& k_pages() const { return k_; }   // (num_pages, page_size, heads_kv, head_dim_qk), dtype
  const Tensor& v_pages() const { return v_; }   // (num_pages, page_size, heads_kv, head_dim_v), dtype
  const Tensor& block_table() const { return table_; }  // (B, pages_per_sequence) i32; -1: no page yet
  const Tensor& seqlens() const { return seqlens_; }    // (B) i32: length(b)
  const Tensor& leftpads() const { return leftpads_; }  // (B) i32: leftpad(b)
  // An 8-bit cache's f32 scales: per_token (num_pages, page_size, heads_kv),
  // per_head (B, heads_kv), per_tensor (1); undefined otherwise.
  const Tensor& k_scales() const { return k_scale_; }
  const Tensor& v_scales() const { return v_scale_; }
  // Points in.k and in.v at the page pools and in.block_table, in.cache_seqlens
  // (and in.cache_leftpad when has_leftpad(); in.k_scale/v_scale when quantized)
  // at the cache's tables, as a spec with kv_page_size = page_size() (and
  // kv_dtype, kv_scale) expects; the other fields are left alone.
  // The views share the cache's storage.
  void bind(Inputs& in) const;

 private:
  void check_seq(std::int64_t seq, const char* field) const;
  // Copies tokens [0, n) of one sequence's new K/V rows, allocating pages.
  // Strides in elements of the cache's dtype.
  void write_tokens(std::int64_t seq, const std::byte* k, std::int64_t ks, std::int64_t kh, const std::byte* v,
                    std::int64_t vs, std::int64_t vh, std::int64_t n);
  // An 8-bit cache: refuses non-finite K/V of an append (before any write) and
  // fixes the per_head / per_tensor scales its values set. Rows as for write_tokens.
  struct AppendRows {
    const std::byte *k, *v;
    std::int64_t ks, kh, vs, vh, n;
  };
  // rows[i] belongs to sequence first_seq + i; `batched` names elements k[b][t][h][d], else k[t][h][d].
  void prepare_quantized(std::span<const AppendRows> rows, std::int64_t first_seq, bool batched);
  float* scale_at(const Tensor& scales, std::int64_t seq, std::int64_t row, std::int64_t h) const;

  KVCacheConfig config_;
  std::int64_t pages_per_seq_ = 0;
  std::vector<std::vector<std::int32_t>> pages_;  // authoritative page list per sequence
  std::vector<std::int32_t> free_;                // free page ids, next to take at the back
  Tensor k_, v_, table_, seqlens_, leftpads_;
  KVScale scale_ = KVScale::none;
  Tensor k_scale_, v_scale_;
  std::vector<char> scale_set_;  // per_head: per sequence; per_tensor: one entry
};

// Attention of new queries q over the cache, Mode::inference. q is
// (B, Sq, H, head_dim_qk) in spec.layout (bshd, bhsd or sbhd) and the cache's
// dtype, Sq >= 1, with B = cache.batch() and H a multiple of heads_kv. From
// `spec` only the logit and mask fields are used (scale, causal, window,
// softcap, alibi, dropout, need_lse, softmax_type); sizes and dtype come from
// q and the cache. Masks are bottom-right aligned to each sequence's own key
// count (length - leftpad): with causal, query i of a sequence with L keys sees
// keys [0, L - Sq + i]. ALiBi needs `alibi_slopes` ((H) or (B, H) f32);
// softmax_type = learnable needs `sinks` ((H) f32 sink logits). Throws
// attend::Error(invalid_argument) for Mode::training (a cache holds no
// gradients) or a spec with a bias.
ForwardResult forward_with_kvcache(const TensorView& q, const KVCache& cache, const AttentionSpec& spec,
                                   Mode mode = Mode::inference, const TensorView& alibi_slopes = {},
                                   const Policy* policy = nullptr, const TensorView& sinks = {});

// The spec and inputs forward_with_kvcache builds (exposed for tools and tests
// that run a backend directly on the cache). Same checks, same errors.
struct KVCacheProblem {
  AttentionSpec spec;
  Inputs inputs;
};
KVCacheProblem kvcache_problem(const TensorView& q, const KVCache& cache, const AttentionSpec& spec,
                               const TensorView& alibi_slopes = {}, const TensorView& sinks = {});

// What in.block_table of validate_cache_append stands for, so that its errors
// name what the caller passed: a block table, or FlashAttention's
// cache_batch_idx over a dense cache (a (B, 1) table of cache rows, pages of
// kv_page_size = the cache's length).
enum class CacheRows { block_table, cache_batch_idx };

// For callers that keep their own block table (FlashAttention's
// flash_attn_with_kvcache): checks, before anything is written, an append of
// new_tokens tokens to every sequence of a paged problem whose
// in.cache_seqlens already hold the lengths after the append. Runs
// validate_inputs(spec, in), then (host tables) refuses an append that writes
// two tokens to one (page, slot), or a token into a slot that a sequence of the
// call reads as context ([cache_leftpad, length before the append)), its own
// included: either would overwrite a key silently. Pages shared by several
// sequences as a read-only prefix stay legal. O(table + new tokens · log).
// The attend::Error names block_table with the slot and both (sequence, token)
// pairs, or cache_batch_idx with the repeated row and its two positions.
void validate_cache_append(const AttentionSpec& spec, const Inputs& in, std::int64_t new_tokens,
                           CacheRows rows = CacheRows::block_table);

}  // namespace attend
