// AttentionSpec — the problem, independent of where its data lives.
//
// Semantics follow FlashAttention (see README "Semantics"):
//   s_ij = scale * <q_i, k_j>
//   s_ij = softcap * tanh(s_ij / softcap)                 if softcap > 0
//   s_ij += -slope[b,h] * |i + Sk - Sq - j|               if alibi
//   s_ij += bias[b,h,i,j]                                 if has_bias
//   s_ij = -inf outside the mask (causal / window, bottom-right aligned)
//   P = softmax_j(s);  P' = P * keep / (1 - dropout_p);  O_i = sum_j P'_ij v_j
//   LSE_i = log sum_j exp(s_ij)   (natural log, before dropout)
// A row with no unmasked key has O_i = 0 and LSE_i = -inf.
//
// Attention sinks (softmax_type != vanilla) add one logit z per query head
// that takes probability mass but carries no value (TransformerEngine's
// softmax_type, gpt-oss's sinks): P_ij = exp(s_ij) / (exp(z_h) + sum_j exp(s_ij))
// and LSE_i = log(exp(z_h) + sum_j exp(s_ij)) includes it. z enters as given:
// not scaled, not softcapped, no ALiBi, bias or mask, never dropped. A row with
// no unmasked key then has O_i = 0 and LSE_i = z_h. Backward also gives
// dz_h = -sum_{b,i} exp(z_h - LSE_i) * D_i, D_i = rowsum(dO_i * O_i).
//
// Partial problems (context parallelism, split-KV): q_offset / kv_offset shift
// the query and key positions that masks, ALiBi and the dropout counter use, so
// a chunk of a longer sequence computes exactly its part of the whole; with
// out_dtype = f32 the partial output keeps full precision, attend::merge
// combines partials through their LSEs, and accumulate_grads makes backward add
// into dq/dk/dv. docs/semantics.md has the formulas.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "attend/dtype.h"
#include "attend/tensor.h"

namespace attend {

// What the caller is going to do with the result. Training needs a backend that
// supports forward AND backward for the spec; inference only needs forward.
enum class Mode : std::uint8_t { inference, training };
// One direction of the computation; backends declare support per pass.
enum class Pass : std::uint8_t { forward, backward };

// The softmax of each query row (see the header comment):
//   vanilla     exp(s_ij) / sum_j exp(s_ij)
//   off_by_one  exp(s_ij) / (1 + sum_j exp(s_ij))          (an implicit sink logit 0)
//   learnable   exp(s_ij) / (exp(z_h) + sum_j exp(s_ij))   (Inputs::sinks holds z, shape (H))
enum class SoftmaxType : std::uint8_t { vanilla, off_by_one, learnable };

std::string_view to_string(Mode mode);
std::string_view to_string(Pass pass);
std::string_view to_string(SoftmaxType type);
// "vanilla", "off_by_one" or "learnable"; throws attend::Error naming `field` otherwise.
SoftmaxType parse_softmax_type(std::string_view text, std::string_view field = "softmax_type");

// How the scales of an 8-bit K/V (AttentionSpec::kv_dtype) are laid out. The
// value a code stands for is code * scale; Inputs::k_scale scales K and
// Inputs::v_scale scales V, both f32, finite and > 0:
//   none        no scale tensors: every scale is 1
//   per_tensor  shape (1): one scale for the whole tensor
//   per_head    shape (B, Hkv): one per (sequence, kv head) — FlashAttention 3's
//               q/k/v_descale convention (vLLM's per-layer scale is per_tensor)
//   per_token   k's shape without its last dim — one per (token, kv head):
//               (B, Sk, Hkv) in bshd, (B, Hkv, Sk) bhsd, (Sk, B, Hkv) sbhd,
//               (total_kv, Hkv) thd, (pages, page_size, Hkv) paged. The usual
//               choice for int8, whose per-head scale loses outlier tokens.
enum class KVScale : std::uint8_t { none, per_tensor, per_head, per_token };
std::string_view to_string(KVScale scale);
// "none", "per_tensor", "per_head" or "per_token"; throws attend::Error naming `field` otherwise.
KVScale parse_kv_scale(std::string_view text, std::string_view field = "kv_scale");

struct AttentionSpec {
  // --- sizes --------------------------------------------------------------------
  std::int64_t batch = 1;       // number of sequences (B); varlen: entries of cu_seqlens - 1
  std::int64_t seqlen_q = 1;    // queries per sequence; varlen: the maximum over sequences
  std::int64_t seqlen_kv = 1;   // keys per sequence; varlen: the maximum over sequences
  std::int64_t heads_q = 1;     // query heads (H)
  std::int64_t heads_kv = 1;    // key/value heads; H % heads_kv == 0, query head h reads
                                // kv head h / (H / heads_kv)  (GQA; MQA when heads_kv == 1)
  std::int64_t head_dim_qk = 64;  // feature size of q and k
  std::int64_t head_dim_v = 64;   // feature size of v and out; may differ (e.g. 192/128, MLA)
  // Varlen only: total packed tokens, the first dim of the thd tensors.
  std::int64_t total_q = 0;
  std::int64_t total_kv = 0;

  // --- data --------------------------------------------------------------------
  DType dtype = DType::f32;     // of q, k, v, out, bias and all gradients (but see dq_dtype)
  // dtype of dq; unset: dtype. bf16/f16 problems may ask for f32: dq is then the
  // backward kernel's f32 accumulator written out unrounded (FlashAttention's
  // dq_accum), e.g. to sum gradients over micro-batches without half-precision
  // rounding. Any other choice is an attend::Error from validate().
  std::optional<DType> dq_dtype;
  // dtype of out (and of dout in backward); unset: dtype. bf16/f16 problems may
  // ask for f32: a partial output to be merged without intermediate rounding.
  std::optional<DType> out_dtype;
  Layout layout = Layout::bshd; // of q, k, v, out, dout, dq, dk, dv; thd <=> varlen
  // dtype of k and v; unset: dtype. fp8_e4m3, fp8_e5m2 or i8 with an f32, bf16
  // or f16 problem: a quantized KV cache whose codes stand for code * scale
  // (kv_scale). Forward only: no backend has a backward for 8-bit K/V, so
  // Mode::training never selects one. q, out and the accumulation keep dtype.
  std::optional<DType> kv_dtype{};
  KVScale kv_scale = KVScale::none;  // layout of Inputs::k_scale / v_scale (8-bit kv_dtype only)

  // --- logits ------------------------------------------------------------------
  std::optional<double> scale;  // multiplies q.k; default 1/sqrt(head_dim_qk)
  double softcap = 0.0;         // > 0 enables softcap*tanh(s/softcap); 0 disables
  bool alibi = false;           // slopes (f32, shape (H) or (B,H)) passed with the inputs
  bool has_bias = false;        // additive bias (dtype, shape (1|B, 1|H, seqlen_q, seqlen_kv))
  bool bias_requires_grad = false;  // training also produces dbias (same shape as bias)
  // Attention sinks: off_by_one adds a sink logit 0 to every row's softmax,
  // learnable one logit per query head from Inputs::sinks ((H), f32; f64 for
  // f64 problems), whose gradient backward writes to BackwardArgs::dsinks.
  SoftmaxType softmax_type = SoftmaxType::vanilla;

  // --- mask (bottom-right aligned: row i sits at key position i + seqlen_kv - seqlen_q) --
  bool causal = false;              // keep j <= i + Sk - Sq; forces window_right = 0
  std::int64_t window_left = -1;    // keep j >= i + Sk - Sq - window_left; -1 = unbounded
  std::int64_t window_right = -1;   // keep j <= i + Sk - Sq + window_right; -1 = unbounded

  // --- positions of a partial problem ------------------------------------------
  // Query row i sits at position q_offset + i, key j at kv_offset + j: masks and
  // ALiBi compare (q_offset + i) + (Sk - Sq) with kv_offset + j, and the dropout
  // mask is drawn at (q_offset + i, kv_offset + j). 0/0 is the ordinary problem.
  // A rank holding query chunk [a, a+c) and key chunk [b, b+c) of one sequence
  // sets q_offset = a, kv_offset = b. Both >= 0.
  std::int64_t q_offset = 0;
  std::int64_t kv_offset = 0;

  // --- regularisation ----------------------------------------------------------
  double dropout_p = 0.0;       // in [0, 1); kept entries scale by 1/(1-p)
  std::uint64_t dropout_seed = 0;  // keys the Philox mask: same seed, same mask, any backend

  // --- outputs / behaviour -----------------------------------------------------
  bool need_lse = true;         // write LSE (always kept internally for training)
  bool deterministic = false;   // backward must be bitwise identical across thread counts
  bool accumulate_grads = false;  // backward adds into dq/dk/dv (e.g. one ring step of many)

  // --- paged K/V (a KV cache; inference) ---------------------------------------
  // > 0: k and v are page pools shaped (pages, kv_page_size, heads_kv, dim), whatever
  // the layout of q/out (which must be dense: bshd, bhsd or sbhd). Sequence b's token t
  // is row t % kv_page_size of page block_table[b, t / kv_page_size]; its keys are the
  // tokens [cache_leftpad[b] (0 without kv_leftpad), cache_seqlens[b]), re-indexed from
  // 0, so masks and ALiBi align to each sequence's own key count. seqlen_kv is then the
  // largest key count of any sequence. 0: k/v are ordinary tensors in `layout`.
  std::int64_t kv_page_size = 0;
  bool kv_leftpad = false;      // paged only: cache_leftpad is given

  bool varlen() const { return layout == Layout::thd; }
  bool paged() const { return kv_page_size > 0; }
  double effective_scale() const;
  // The window after FlashAttention's normalisation: causal forces right = 0.
  std::int64_t effective_window_right() const { return causal ? 0 : window_right; }
  bool is_masked() const { return causal || window_left >= 0 || window_right >= 0; }
  std::int64_t group_size() const { return heads_q / heads_kv; }
  DType effective_dq_dtype() const { return dq_dtype.value_or(dtype); }
  DType effective_out_dtype() const { return out_dtype.value_or(dtype); }
  DType lse_dtype() const { return dtype == DType::f64 ? DType::f64 : DType::f32; }
  DType effective_kv_dtype() const { return kv_dtype.value_or(dtype); }
  bool kv_quantized() const { return is_kv8(effective_kv_dtype()); }
  bool has_offsets() const { return q_offset != 0 || kv_offset != 0; }
  bool has_sink() const { return softmax_type != SoftmaxType::vanilla; }
};

// The tensors a spec describes, for expected_shape().
enum class Role : std::uint8_t {
  q,
  k,
  v,
  out,
  lse,
  dout,
  dq,
  dk,
  dv,
  bias,
  cu_seqlens_q,
  cu_seqlens_kv,
  sinks,
  dsinks,
  k_scale,
  v_scale
};
std::string_view to_string(Role role);

// The shape a tensor of `role` must have for `spec`, in spec.layout (bshd:
// (B, S, H, D); bhsd: (B, H, S, D); sbhd: (S, B, H, D); thd: (total, H, D); LSE
// (B, H, Sq) or (H, total_q); bias the full (B, H, Sq, Sk); k_scale/v_scale
// as KVScale says, (0) for KVScale::none). Paged k/v (and
// dk/dv) are pools whose page count the spec does not fix: their first
// dimension is returned as -1. The one place the layout -> shape rule lives.
struct Shape {
  int ndim = 0;
  std::int64_t dims[4] = {};
  std::span<const std::int64_t> span() const { return {dims, static_cast<std::size_t>(ndim)}; }
};
Shape expected_shape(const AttentionSpec& spec, Role role);
// The dtype of that tensor (dq: effective_dq_dtype, out/dout: effective_out_dtype,
// k/v: effective_kv_dtype, lse, sinks and dsinks: lse_dtype, k_scale/v_scale:
// f32, cu_seqlens: i32, otherwise dtype). Sinks
// and dsinks are (H).
DType expected_dtype(const AttentionSpec& spec, Role role);

// Checks every field of the spec on its own (no tensors): positive sizes, GQA
// divisibility, finite scale/softcap, window >= -1, dropout in [0,1), layout vs
// varlen, dq_dtype, and that every tensor the spec implies has a byte size that fits in
// size_t. Throws attend::Error naming the first bad field.
void validate(const AttentionSpec& spec);

// A compact, stable string of every field that can influence backend choice
// (spec_fields() marks them); equal signatures mean equal selections.
std::string signature(const AttentionSpec& spec);

// One-line human summary, e.g. "B=2 Sq=1024 Sk=1024 H=16/16 D=192/128 f32 bshd causal".
std::string describe(const AttentionSpec& spec);

}  // namespace attend
