// Flash backward for one (batch, kv head): for each key block, sweep every
// query block of every query head in the task's part of the GQA group,
// recompute P from the saved LSE, accumulate dK/dV in the tile and dQ in the
// output. One task owns all writes to its dK/dV rows and its heads' dQ rows,
// with no atomics. A group split over several tasks (BackwardTask) writes f32
// dK/dV shares instead, summed in a fixed order by store_kv_parts; the split
// follows the spec, never the thread count, so the result is bitwise identical
// for any thread count.
//
// K^T, V^T and K are packed once per key block (the softmax scale folded into
// K^T, as the forward folds it into K, so that both form the same scores); Q and dO rows are copied into contiguous
// blocks per query block (rows of one head sit H*D floats apart in the user's tensor, which makes in-place GEMM loads
// conflict in L1). The transposed products (P'^T dO, dS^T Q) read the P and dS tiles through the GEMM's strided A
// operand — no tile transposes.
//
// E is the element type of q/k/v/out/dout and the gradients (float, bf16_t,
// f16_t): rows are widened to f32 as they are packed, dK/dV rounded to E once
// when stored. dQ accumulates across key blocks: into dq itself when dq is f32
// (f32 problems, or spec.dq_dtype = f32), otherwise into an f32 buffer of the
// task's whole GQA group (group * seqlen_q * dqk floats after the tiles, see
// flash_backend.cpp) rounded to E once at the end — rounding per key block
// would add one half-precision rounding per block.
// Included inside an ISA namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"
#include "backends/flash/nonfinite_tile.h"
#include "backends/flash/pack_tile.h"

namespace attend::flash::ATTEND_FLASH_ISA {

// D_i = rowsum(dO_i * O_i) of the softmax gradient dS = P (dP - D), for the
// m rows from query i0 (dO f32 with row stride ldd, O of element type E with
// row stride lds) whose visible keys are not all in the key block
// [j0, j0 + n). The others are marked in `in_block` and take their D from the
// tile (tile_softmax_grad), their dsum 0 until then.
template <class S, class E>
inline void softmax_grad_rows(const FlashParams& p, const detail::SeqSpan& span, std::int64_t i0, std::int64_t j0,
                              std::int64_t n, const float* dout, std::int64_t ldd, const E* out, std::int64_t lds,
                              std::int64_t m, float* dsum, bool* in_block) {
  for (std::int64_t r = 0; r < m; ++r) {
    const detail::KeyRange vis = p.keys(i0 + r, span);
    in_block[r] = vis.begin >= j0 && vis.end <= j0 + n && vis.end > vis.begin;
    dsum[r] = in_block[r] ? 0.0f : dot<S>(dout + r * ldd, out + r * lds, p.dv);
  }
  nan_unless_finite(dsum, m);
}

// Rows that see at most this many keys, all in the current tile, take their
// scores and dP from dot_f64 (few_key_dots, which says what it costs).
inline constexpr std::int64_t kFewKeys = 4;

inline bool few_keys(const detail::KeyRange& vis, bool in_block) { return in_block && vis.end - vis.begin <= kFewKeys; }

// a . b over n elements, summed in double: the product of two floats is exact
// there, so the sum carries ~n 2^-53 relative error. Eight running sums in
// lanes, which the compiler may vectorise (the order is fixed either way).
template <class E>
inline double dot_f64(const float* a, const E* b, std::int64_t n) {
  double acc[8] = {};
  std::int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(a[d + l]) * detail::to_f32(b[d + l]);
  }
  double sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; d < n; ++d) sum += static_cast<double>(a[d]) * detail::to_f32(b[d]);
  return sum;
}

// put(r, j, j - first visible key, a_r . b(j)) in double for each visible key j of the m rows from
// query i0 that see few keys, all in the tile (few_keys); b(j) is key j's row
// of `depth` elements. A row of few keys turns the f32 error of its scores
// and dP into a relative error of its whole gradient: with two keys
// dS_1 = -dS_2 = P_1 P_2 (dP_1 - dP_2), off by (P_2 - P_1) e(s_1 - s_2) and
// e(dP_1 - dP_2) / (dP_1 - dP_2). With one f32 chain over the head dim dQ
// missed the strict rule at 1.44 x (Sq 299, Sk 2, D 256/128, MQA, scale
// 0.477); chains of kDotChunk (dot_blocked) still left 1.2 x at 2 to 4 keys.
// The double dots cost a quarter to half of a backward whose rows all see 2 to
// 4 keys (one core, Zen 5); at 16 keys they cost 3 x, so longer rows keep the
// GEMM's scores (dot_blocked's, within the rule from 5 keys on).
template <class B, class Put>
inline void few_key_dots(const FlashParams& p, const detail::SeqSpan& span, std::int64_t i0, std::int64_t m,
                         const bool* in_block, const float* a, std::int64_t lda, B b, std::int64_t depth, Put put) {
  for (std::int64_t r = 0; r < m; ++r) {
    const detail::KeyRange vis = p.keys(i0 + r, span);
    if (!few_keys(vis, in_block[r])) continue;
    for (std::int64_t j = vis.begin; j < vis.end; ++j) put(r, j, j - vis.begin, dot_f64(a + r * lda, b(j), depth));
  }
}

// D of the rows whose visible keys all lie in this tile (in_block), as the
// textbook softmax backward forms it: D = sum_j P_ij dP_ij over the row's
// keys, with P and dP (after dropout) of the tile whose columns start at key
// jt (row stride ld). dS_ij = P_ij (dP_ij - D) is then a difference of large
// terms when a row sees few keys, and only this D makes the rounding errors of
// the dP_ij cancel in it as P concentrates on one key (dS_ij carries
// P_ij sum_k P_ik (e_j - e_k)); rowsum(dO * O), formed from the rounded O
// over Dv products, left an error ~eps |dO| |O| sqrt(Dv) that nothing scales
// down: the strict rule's misses on rows of 2 to 7 keys at Dv = 128 to 512.
// Summed in double (one rounding: at most a block of products per row, once).
//
// Such a row's P is also renormalised here, to the softmax of this tile's own
// scores: P = exp(s - LSE) takes the forward's LSE, rounded to f32 (every P of
// the row off by one factor 1 + d, |d| up to |LSE| 2^-24: 2e-6 at LSE = 32)
// and summed from the forward's scores, whose rounding differs from these by
// ~eps sum_d |q_d k_d| scale per key. An unnormalised D would leave d P_ij D
// in each dS_ij, and P's that do not sum to 1 give a dS that is the gradient
// of no softmax; divided by the row's mass, dS is the softmax gradient of the
// scores as computed here, as in the naive algorithm. (rowsum(dO * O) is
// normalised too: the forward divides O by its own sum.)
//
// All this holds only when the tile holds the row's whole softmax: the LSE may
// be a longer row's (a ring step's block of keys, with the merged O and LSE),
// where D has to come from dO * O and P from that LSE. The row's mass
// sum_j P_ij (+ its sink's exp(z - LSE)) tells: 1 up to the roundings above
// for a whole row; a partial row misses the other blocks' share, and one
// whose missing share is below the tolerance (2^-19 + 2^-20 |LSE|: 16 ulps of
// the LSE) gets an error below tol * max|dP - D|. Rows of a non-finite tile
// keep rowsum(dO * O) (nonfinite_tile.h).
//
// A whole row of few keys (few_keys) then moves to the softmax of its exact
// scores: shift holds, kFewKeys per row from its first visible key, each
// exact score minus the GEMM's (few_key_dots), and dcap (softcap only) the
// logit's derivative, so P_j exp(dcap_j shift_j) ~ P_j (1 + dcap_j shift_j),
// to the shift's square (~1e-11), before the renormalisation. The mass test
// takes P of the GEMM's scores, those the forward's LSE was summed from.
template <class S, class E>
inline void tile_softmax_grad(const FlashParams& p, const detail::SeqSpan& span, std::int64_t h, std::int64_t i0,
                              std::int64_t jt, float* pt, const float* dp, std::int64_t ld, const float* lse,
                              const bool* in_block, bool finite, const float* dout, std::int64_t ldd, const E* out,
                              std::int64_t lds, std::int64_t m, float* dsum, const float* shift, const float* dcap) {
  const bool has_sink = p.sinks.any();
  const double sink = p.sinks(h);
  for (std::int64_t r = 0; r < m; ++r) {
    if (!in_block[r]) continue;
    if (finite && std::isfinite(lse[r])) {
      const detail::KeyRange vis = p.keys(i0 + r, span);
      float* pr = pt + r * ld;
      const float* dpr = dp + r * ld;
      const std::int64_t lo = vis.begin - jt, hi = vis.end - jt;
      double mass = has_sink ? std::exp(sink - lse[r]) : 0.0, d = 0.0;
      for (std::int64_t j = lo; j < hi; ++j) {
        mass += pr[j];
        d += static_cast<double>(pr[j]) * dpr[j];
      }
      if (std::abs(mass - 1.0) <= 0x1p-19 + 0x1p-20 * std::abs(lse[r])) {
        if (few_keys(vis, true)) {
          const float* sh = shift + r * kFewKeys - lo;
          mass = has_sink ? std::exp(sink - lse[r]) : 0.0;
          d = 0.0;
          for (std::int64_t j = lo; j < hi; ++j) {
            const double x = dcap ? static_cast<double>(dcap[r * ld + j]) * sh[j] : sh[j];
            pr[j] = static_cast<float>(pr[j] * (1.0 + x));
            mass += pr[j];
            d += static_cast<double>(pr[j]) * dpr[j];
          }
        }
        const double inv = 1.0 / mass;
        for (std::int64_t j = lo; j < hi; ++j) pr[j] = static_cast<float>(pr[j] * inv);
        dsum[r] = static_cast<float>(d * inv);
        continue;
      }
    }
    dsum[r] = dot<S>(dout + r * ldd, out + r * lds, p.dv);
  }
  nan_unless_finite(dsum, m);
}

// `rows` rows of `cols` elements (stride ld) widened into a zero-padded [rows x ldp] f32 block
// with vector loads and stores (this runs once per key block and query block;
// a memcpy per row costs a call and a size dispatch for a few hundred bytes).
template <class S, class E>
inline void padded_rows(const E* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, std::int64_t ldp,
                        float* dst) {
  for (std::int64_t r = 0; r < rows; ++r) copy_row<S>(src + r * ld, cols, dst + r * ldp, ldp);
}

// A gradient row from its f32 sum, rounded to E once; with
// spec.accumulate_grads added to what the row holds (which is read only then:
// the memory may be uninitialised otherwise).
template <class S, class E>
inline void store_grad_row(const FlashParams& p, E* dst, const float* src, std::int64_t n) {
  if (!p.accumulate) {
    detail::store_row<S>(dst, src, n);
    return;
  }
  for (std::int64_t d = 0; d < n; ++d) dst[d] = detail::from_f32<E>(detail::to_f32(dst[d]) + src[d]);
}

// Where dQ row i of group head g of task (b, hk) accumulates: in dq itself
// when it is f32, else in the task's f32 sum right after the ISA's tiles.
template <class S>
float* dq_accum_row(const FlashParams& p, std::int64_t b, std::int64_t hk, const detail::SeqSpan& span,
                    float* scratch, std::int64_t g, std::int64_t i) {
  if (p.dq_f32) return p.dq_as<float>() + p.sdq.offset(b, span.q_begin + i, hk * p.group + g);
  return scratch + backward_scratch_floats<S>(p.dqk, p.dv) + (g * span.q_len + i) * p.dqk;
}

// With spec.accumulate_grads an f32 dq already holds the sum to add to.
template <class S>
void zero_dq_accum(const FlashParams& p, const BackwardTask& t, const detail::SeqSpan& span, float* scratch) {
  if (p.dq_f32 && p.accumulate) return;
  for (std::int64_t g = t.g_begin; g < t.g_end; ++g) {
    for (std::int64_t i = 0; i < span.q_len; ++i) {
      float* row = dq_accum_row<S>(p, t.b, t.hk, span, scratch, g, i);
      std::fill(row, row + p.dqk, 0.0f);
    }
  }
}

// Rounds the task's f32 dQ sum into dq (nothing to do when dq is f32).
template <class S, class E>
void store_dq_accum(const FlashParams& p, const BackwardTask& t, const detail::SeqSpan& span, float* scratch) {
  if constexpr (!std::is_same_v<E, float>) {
    if (p.dq_f32) return;
    for (std::int64_t g = t.g_begin; g < t.g_end; ++g) {
      for (std::int64_t i = 0; i < span.q_len; ++i) {
        store_grad_row<S>(p, p.dq_as<E>() + p.sdq.offset(t.b, span.q_begin + i, t.hk * p.group + g),
                          dq_accum_row<S>(p, t.b, t.hk, span, scratch, g, i), p.dqk);
      }
    }
  }
}

// dQ rows [i0, i0 + m) of group head g += the m rows of the tile (row stride ldt).
template <class S>
inline void add_dq_tile(const FlashParams& p, std::int64_t b, std::int64_t hk, const detail::SeqSpan& span,
                        float* scratch, std::int64_t g, std::int64_t i0, std::int64_t m, const float* tile,
                        std::int64_t ldt) {
  for (std::int64_t r = 0; r < m; ++r)
    add_row<S>(dq_accum_row<S>(p, b, hk, span, scratch, g, i0 + r), tile + r * ldt, p.dqk);
}

// dK/dV of the key block's n rows [j0, j0 + n), from their f32 accumulators
// (row strides dqp, dvp), rounded to E once.
template <class S, class E>
inline void store_kv_grads(const FlashParams& p, std::int64_t b, std::int64_t hk, const detail::SeqSpan& span,
                           std::int64_t j0, std::int64_t n, const float* dk_acc, std::int64_t dqp,
                           const float* dv_acc, std::int64_t dvp) {
  for (std::int64_t j = 0; j < n; ++j) {
    store_grad_row<S>(p, p.dk_as<E>() + p.sdk.offset(b, span.kv_begin + j0 + j, hk), dk_acc + j * dqp, p.dqk);
    store_grad_row<S>(p, p.dv_as<E>() + p.sdv.offset(b, span.kv_begin + j0 + j, hk), dv_acc + j * dvp, p.dv);
  }
}

// Whether query block [i0, i0 + m) sees some key of [j0, j0 + n) (the
// causal / window skip).
inline bool block_sees(const FlashParams& p, const detail::SeqSpan& span, std::int64_t i0, std::int64_t m,
                       std::int64_t j0, std::int64_t n) {
  const detail::KeyRange first = p.keys(i0, span), last = p.keys(i0 + m - 1, span);
  return first.begin < j0 + n && last.end > j0 && last.end > first.begin;
}

// Rows of one head sit H*D elements apart in the user's tensors (4 KiB at
// H = 16, D = 64: one L1 set, and too far apart for the hardware
// prefetchers), so the first touch of every row stalled the Q/dO copies, the
// dO . O dot and the dQ update, and K/V packing. While a tile computes, ask
// for the rows of the next query block the loops visit after (g, i0) of key
// block j0 — after a key block's last one, for the next key block's K and V
// rows and its first query block.
template <class S, class E>
void prefetch_next_block(const FlashParams& p, const BackwardTask& task, const detail::SeqSpan& span,
                         float* scratch, std::int64_t bm, std::int64_t bn, std::int64_t g, std::int64_t i0,
                         std::int64_t j0) {
  const std::int64_t b = task.b, hk = task.hk;
  std::int64_t n = std::min(bn, span.kv_len - j0);
  bool next_keys = false;
  for (i0 += bm;; i0 += bm) {
    if (i0 >= span.q_len) {
      i0 = 0;
      if (++g == task.g_end) {
        if (next_keys || j0 + bn >= span.kv_len) return;
        next_keys = true;
        g = task.g_begin;
        j0 += bn;
        n = std::min(bn, span.kv_len - j0);
        for (std::int64_t j = j0; j < j0 + n; ++j) {
          prefetch_row(p.k_row<E>(b, span, j, hk), p.dqk);
          prefetch_row(p.v_row<E>(b, span, j, hk), p.dv);
        }
      }
    }
    if (block_sees(p, span, i0, std::min(bm, span.q_len - i0), j0, n)) break;
  }
  const std::int64_t h = hk * p.group + g, m = std::min(bm, span.q_len - i0);
  for (std::int64_t r = 0; r < m; ++r) {
    const std::int64_t row = span.q_begin + i0 + r;
    prefetch_row(p.q_as<E>() + p.sq.offset(b, row, h), p.dqk);
    prefetch_row(p.dout_as<E>() + p.sdo.offset(b, row, h), p.dv);
    prefetch_row(p.out_as<E>() + p.so.offset(b, row, h), p.dv);
    prefetch_row(dq_accum_row<S>(p, b, hk, span, scratch, g, i0 + r), p.dqk);
  }
}

// The key block's dK/dV: stored, or copied into the task's share of a split group.
template <class S, class E>
inline void emit_kv_grads(const FlashParams& p, const BackwardTask& t, const detail::SeqSpan& span, std::int64_t j0,
                          std::int64_t n, const float* dk_acc, std::int64_t dqp, const float* dv_acc,
                          std::int64_t dvp) {
  if (!t.kv_part) {
    store_kv_grads<S, E>(p, t.b, t.hk, span, j0, n, dk_acc, dqp, dv_acc, dvp);
    return;
  }
  float* dk = t.kv_part + j0 * p.dqk;
  float* dv = t.kv_part + p.seqlen_kv * p.dqk + j0 * p.dv;
  for (std::int64_t j = 0; j < n; ++j) {
    std::copy(dk_acc + j * dqp, dk_acc + j * dqp + p.dqk, dk + j * p.dqk);
    std::copy(dv_acc + j * dvp, dv_acc + j * dvp + p.dv, dv + j * p.dv);
  }
}

// A split group's dK/dV for key rows [j0, j0 + n): the shares summed into the
// first in share order (a fixed order: bitwise reproducible), then stored.
template <class S, class E>
void store_kv_parts(const FlashParams& p, const BackwardTask& t, std::int64_t parts, std::int64_t j0, std::int64_t n) {
  const std::int64_t part_floats = p.seqlen_kv * (p.dqk + p.dv);
  float* dk = t.kv_part + j0 * p.dqk;
  float* dv = t.kv_part + p.seqlen_kv * p.dqk + j0 * p.dv;
  for (std::int64_t i = 1; i < parts; ++i) {
    add_row<S>(dk, dk + i * part_floats, n * p.dqk);
    add_row<S>(dv, dv + i * part_floats, n * p.dv);
  }
  store_kv_grads<S, E>(p, t.b, t.hk, p.span(t.b), j0, n, dk, p.dqk, dv, p.dv);
}

template <class S, class E>
void backward_head(const FlashParams& p, const BackwardTask& task, float* scratch) {
  using Tr = KernelTraits<S>;
  using V = typename S::V;
  constexpr std::int64_t BM = Tr::bwd_m, BN = Tr::bwd_n;
  constexpr int MR = Tr::mr, NV = Tr::nv;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const std::int64_t b = task.b, hk = task.hk;
  const detail::SeqSpan span = p.span(b);
  const std::int64_t dqk = p.dqk, dv = p.dv, dqp = round_up(dqk, S::W), dvp = round_up(dv, S::W);

  float* kt = scratch;                 // dqk x BN   scale * K^T, for S = Q K^T
  float* vt = kt + dqk * BN;           // dv x BN    V^T, for dP = dO V^T
  float* kblk = vt + dv * BN;          // BN x dqp   K rows
  float* dk_acc = kblk + BN * dqp;     // BN x dqp
  float* dv_acc = dk_acc + BN * dqp;   // BN x dvp
  float* qblk = dv_acc + BN * dvp;     // BM x dqp   Q rows
  float* doblk = qblk + BM * dqp;      // BM x dvp   dO rows
  float* pt = doblk + BM * dvp;        // BM x BN    P, then P'
  float* ds = pt + BM * BN;            // BM x BN    dP, then scale * dS
  float* th = ds + BM * BN;            // BM x BN    1 - tanh^2 (softcap only)
  float* dq_tile = th + BM * BN;       // BM x dqp
  float* dsum = dq_tile + BM * dqp;    // BM         D_i
  float* lse = dsum + BM;              // BM
  bool in_block[BM];                   // D_i from this tile (tile_softmax_grad)
  float shift[BM * kFewKeys];          // exact minus GEMM scores of rows of few keys

  zero_dq_accum<S>(p, task, span, scratch);  // this task owns these dQ rows

  for (std::int64_t j0 = 0; j0 < span.kv_len; j0 += BN) {
    const std::int64_t n = std::min(BN, span.kv_len - j0), n_pad = round_up(n, S::W);
    const E* ksrc = static_cast<const E*>(p.k) + p.sk.offset(b, span.kv_begin + j0, hk);
    const E* vsrc = static_cast<const E*>(p.v) + p.sv.offset(b, span.kv_begin + j0, hk);
    pack_transposed<S>(ksrc, p.sk.s, n, n_pad, dqk, p.scale, kt, BN);
    pack_transposed<S>(vsrc, p.sv.s, n, n_pad, dv, 1.0f, vt, BN);
    padded_rows<S>(ksrc, p.sk.s, n, dqk, dqp, kblk);
    std::fill(dk_acc, dk_acc + n * dqp, 0.0f);
    std::fill(dv_acc, dv_acc + n * dvp, 0.0f);

    for (std::int64_t g = task.g_begin; g < task.g_end; ++g) {
      const std::int64_t h = hk * p.group + g;
      for (std::int64_t i0 = 0; i0 < span.q_len; i0 += BM) {
        const std::int64_t m = std::min(BM, span.q_len - i0);
        // Skip query blocks that see none of these keys (causal / window).
        const detail::KeyRange first = p.keys(i0, span), last = p.keys(i0 + m - 1, span);
        if (first.begin >= j0 + n || last.end <= j0 || last.end <= first.begin) continue;

        const std::int64_t row0 = span.q_begin + i0;
        padded_rows<S>(p.q_as<E>() + p.sq.offset(b, row0, h), p.sq.s, m, dqk, dqp, qblk);
        padded_rows<S>(p.dout_as<E>() + p.sdo.offset(b, row0, h), p.sdo.s, m, dv, dvp, doblk);
        const E* out = p.out_as<E>() + p.so.offset(b, row0, h);
        softmax_grad_rows<S>(p, span, i0, j0, n, doblk, dvp, out, p.so.s, m, dsum, in_block);
        for (std::int64_t r = 0; r < m; ++r) lse[r] = p.lse[p.slse.offset(b, row0 + r, h)];
        prefetch_next_block<S, E>(p, task, span, scratch, BM, BN, g, i0, j0);

        // Only keys [j0 + c0, j0 + c0 + nk) of the block are seen by some row
        // (visible ranges only move right as the row grows), so under a causal
        // or window mask a diagonal tile stops at its last visible key, as the
        // forward does: the columns left out would be -inf logits, zero P and
        // dS, and their products exact zeros. [c0, c0 + nc) is that range
        // widened to whole vectors; t_* point at its first column.
        const std::int64_t c0 = std::max<std::int64_t>(0, first.begin - j0) / S::W * S::W;
        const std::int64_t c1 = std::min(n, last.end - j0), nk = c1 - c0, nc = round_up(c1, S::W) - c0;
        float *t_p = pt + c0, *t_ds = ds + c0, *t_th = th + c0;

        // In a diagonal tile a vector of rows sees only the keys up to its last
        // row's: the products below go a vector of rows (or keys) at a time
        // over those (exact: the pairs left out hold zero P and dS), and the
        // scores and dP left out are zeros (then masked).
        const auto row_keys = [&](std::int64_t r) {  // columns of rows [r, r + W), whole vectors
          const std::int64_t end = p.keys(i0 + std::min(m, r + S::W) - 1, span).end - j0 - c0;
          return std::clamp<std::int64_t>(round_up(end, S::W), 0, nc);
        };
        const bool diagonal = row_keys(0) < nc;
        const auto products = [&](const float* a, std::int64_t lda, const float* bt, std::int64_t depth, float* c) {
          if (!diagonal) return dot_blocked<S, MR, NV>(m, nc, depth, MatA{a, lda, 1}, bt, BN, c, BN);
          for (std::int64_t r = 0; r < m; r += S::W) {
            const std::int64_t mr = std::min<std::int64_t>(S::W, m - r), ncr = row_keys(r);
            if (ncr > 0) dot_blocked<S, MR, NV>(mr, ncr, depth, MatA{a + r * lda, lda, 1}, bt, BN, c + r * BN, BN);
            for (std::int64_t i = r; i < r + mr; ++i) std::fill(c + i * BN + ncr, c + i * BN + nc, 0.0f);
          }
        };

        // Recompute logits exactly as the forward did, then P = exp(s - LSE).
        // A non-finite q or k shows in the raw scores, dO or v in dP, a bad
        // logit term in the LSE: any of them sends the tile to the visible-pair
        // products (nonfinite_tile.h).
        products(qblk, dqp, kt + c0, dqk, t_p);
        const std::int64_t jt = j0 + c0;
        few_key_dots(
            p, span, i0, m, in_block, qblk, dqp, [&](std::int64_t j) { return kblk + (j - j0) * dqp; }, dqk,
            [&](std::int64_t r, std::int64_t j, std::int64_t k, double x) {
              shift[r * kFewKeys + k] = static_cast<float>(p.scale * x - t_p[r * BN + j - jt]);
            });
        bool finite = tile_finite<S>(t_p, m, nc, BN) && lse_and_d_clean(lse, dsum, m);
        const Tile tile{b, h, i0, m, j0 + c0, nk, span, t_p, BN, false, m, nc};
        finish_logits<S, E>(p, tile, p.softcap > 0 ? t_th : nullptr);
        for (std::int64_t r = 0; r < m; ++r) {
          float* row = t_p + r * BN;
          if (lse[r] == kNegInf) {  // empty row: contributes no gradient
            std::fill(row, row + nc, 0.0f);
            continue;
          }
          const V vl = S::set1(lse[r]);
          for (std::int64_t j = 0; j < nc; j += S::W) S::store(row + j, S::exp(S::sub(S::load(row + j), vl)));
        }

        // dP = (dO V^T) * keep/(1-p);  scale * dS = scale * P * (dP - D) [* (1 - tanh^2)]
        products(doblk, dvp, vt + c0, dv, t_ds);
        few_key_dots(
            p, span, i0, m, in_block, doblk, dvp, [&](std::int64_t j) { return p.v_row<E>(b, span, j, hk); }, dv,
            [&](std::int64_t r, std::int64_t j, std::int64_t, double x) {
              t_ds[r * BN + j - jt] = static_cast<float>(x);
            });
        finite = finite && tile_finite<S>(t_ds, m, nc, BN);
        const Tile dtile{b, h, i0, m, j0 + c0, nk, span, t_ds, BN, false, m, nc};
        if (p.dropout) apply_dropout(p, dtile);
        tile_softmax_grad<S>(p, span, h, i0, jt, t_p, t_ds, BN, lse, in_block, finite, doblk, dvp, out, p.so.s, m, dsum,
                             shift, p.softcap > 0 ? t_th : nullptr);
        finite = finite && lse_and_d_clean(lse, dsum, m);
        const V vscale = S::set1(p.scale);
        for (std::int64_t r = 0; r < m; ++r) {
          const V vd = S::set1(dsum[r]);
          for (std::int64_t j = 0; j < nc; j += S::W) {
            const std::int64_t o = r * BN + j;
            V g_s = S::mul(S::load(t_p + o), S::sub(S::load(t_ds + o), vd));
            if (p.softcap > 0) g_s = S::mul(g_s, S::load(t_th + o));
            S::store(t_ds + o, S::mul(g_s, vscale));
          }
        }
        if (p.dropout) apply_dropout(p, tile);  // P -> P' for dV

        // dV += P'^T dO;  dK += (scale dS)^T Q;  dQ += (scale dS) K
        float *t_dv = dv_acc + c0 * dvp, *t_dk = dk_acc + c0 * dqp;
        if (finite && !diagonal) {
          gemm<S, MR, NV>(nk, dvp, m, MatA{t_p, 1, BN}, doblk, dvp, t_dv, dvp, true);
          gemm<S, MR, NV>(nk, dqp, m, MatA{t_ds, 1, BN}, qblk, dqp, t_dk, dqp, true);
          gemm<S, MR, NV>(m, dqp, nk, MatA{t_ds, BN, 1}, kblk + c0 * dqp, dqp, dq_tile, dqp, false);
        } else if (finite) {
          // Keys a vector at a time over the rows that see them; rows a vector
          // at a time over the keys they see.
          for (std::int64_t u = 0; u < nk; u += S::W) {
            const std::int64_t nu = std::min<std::int64_t>(S::W, nk - u);
            const std::int64_t r0 = std::clamp<std::int64_t>(p.queries(j0 + c0 + u, span).begin - i0, 0, m);
            if (r0 == m) break;
            gemm<S, MR, NV>(nu, dvp, m - r0, MatA{t_p + r0 * BN + u, 1, BN}, doblk + r0 * dvp, dvp, t_dv + u * dvp, dvp,
                            true);
            gemm<S, MR, NV>(nu, dqp, m - r0, MatA{t_ds + r0 * BN + u, 1, BN}, qblk + r0 * dqp, dqp, t_dk + u * dqp, dqp,
                            true);
          }
          for (std::int64_t r = 0; r < m; r += S::W) {
            const std::int64_t mr = std::min<std::int64_t>(S::W, m - r), ncr = std::min(row_keys(r), nk);
            if (ncr > 0) {
              gemm<S, MR, NV>(mr, dqp, ncr, MatA{t_ds + r * BN, BN, 1}, kblk + c0 * dqp, dqp, dq_tile + r * dqp, dqp,
                              false);
            } else {
              std::fill(dq_tile + r * dqp, dq_tile + (r + mr) * dqp, 0.0f);
            }
          }
        } else {
          visible_tile_products<S, E>(p, b, h, span, i0, m, j0 + c0, nk, t_p, t_ds, BN, lse, t_dv, dvp, t_dk, dqp,
                                      dq_tile);
        }
        add_dq_tile<S>(p, b, hk, span, scratch, g, i0, m, dq_tile, dqp);
      }
    }
    emit_kv_grads<S, E>(p, task, span, j0, n, dk_acc, dqp, dv_acc, dvp);
  }

  store_dq_accum<S, E>(p, task, span, scratch);
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
