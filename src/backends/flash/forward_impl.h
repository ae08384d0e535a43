// Flash forward for one (batch, query head, query block): online softmax over
// key blocks, never holding more than a block of scores.
//
// The score tile is computed transposed, S^T = K Q^T (keys x queries): Q^T is
// packed once per task, K and V blocks are copied row by row into contiguous
// buffers (no transposes), and the softmax's per-query max and sum become
// element-wise vector operations across key rows. (Reading K/V rows in place
// is slower: rows of one head sit H*D floats apart, often a multiple of 4 KiB,
// and the GEMM's loads then conflict in L1.)
//
// E is the element type of q/bias/out (float, bf16_t, f16_t) and KV that of
// k/v (E, or an 8-bit code type: fp8_e4m3_t, fp8_e5m2_t, int8_t): Q, K and V
// are widened to f32 while they are packed (an 8-bit code times its scale:
// K's scale joins the softmax scale on the packed row, V's multiplies it), the
// output is rounded to E when it is stored; tiles, the online softmax and the
// LSE are f32.
// Included inside an ISA namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"
#include "backends/flash/nonfinite_tile.h"
#include "backends/flash/pack_tile.h"

namespace attend::flash::ATTEND_FLASH_ISA {

// Key j of a block: krow = scale * k (the very products the backward's
// scale * K^T holds: see forward_block), vrow = v widened and zero-padded to
// dvp. Returns bad + v * 0, which is NaN once any v of the block is not finite
// (checked while the row is in registers anyway).
// An 8-bit code type: its rows are dequantized with a scale per (key, kv head).
template <class KV>
inline constexpr bool kv8 = sizeof(KV) == 1;

// (An 8-bit V row is code * v_scale; other types ignore v_scale.)
template <class S, class E>
inline typename S::V pack_kv_row(const E* k, const E* v, std::int64_t dqk, std::int64_t dv, std::int64_t dvp,
                                 float scale, float v_scale, float* krow, float* vrow, typename S::V bad) {
  using V = typename S::V;
  const V vscale = S::set1(scale), zero = S::zero();
  [[maybe_unused]] const V vs = S::set1(v_scale);
  const auto widen_v = [&](const E* x) {
    if constexpr (kv8<E>) {
      return S::mul(detail::load_f32<S>(x), vs);
    } else {
      return detail::load_f32<S>(x);
    }
  };
  const auto widen_v1 = [&](E x) { return kv8<E> ? detail::to_f32(x) * v_scale : detail::to_f32(x); };
  std::int64_t d = 0;
  for (; d + S::W <= dqk; d += S::W) S::store(krow + d, S::mul(detail::load_f32<S>(k + d), vscale));
  for (; d < dqk; ++d) krow[d] = detail::to_f32(k[d]) * scale;
  for (d = 0; d + S::W <= dv; d += S::W) {
    const V x = widen_v(v + d);
    S::store(vrow + d, x);
    bad = S::fmadd(x, zero, bad);
  }
  if (d < dvp) {  // the last partial vector: dvp - d == W
    for (std::int64_t t = d; t < dvp; ++t) vrow[t] = t < dv ? widen_v1(v[t]) : 0.0f;
    bad = S::fmadd(S::load(vrow + d), zero, bad);
  }
  return bad;
}

// The output and the row sums are summed in two levels (issue 36, row 8):
// each key block's P V goes into a level-1 accumulator, which every K blocks
// is folded into a level-2 one and emptied. Added one block after the other to
// a single f32 accumulator, N keys' rounding errors grow as N (2.4e-2
// relative at 2^29 identical keys); in two levels as K * serial + blocks / K,
// least at K = sqrt(blocks / serial), where `serial` counts the additions one
// block makes to an accumulator element (1 for gemm_tile, which sums a block
// from zero; a term per key pair for vdpbf16ps). The floor of 64 blocks keeps
// rows of up to 8192 keys (at 128 per block) on one level. A fold is a pass
// over both accumulators: every 16 blocks it cost 1-2 % at 8192 keys, every
// 64 it is within the noise (16384 keys: +0.6 %). Below 2^19 keys the floor
// is above sqrt(...), and 64 blocks in one level still err by ~1e-6.
// A query block that sees no key at all has a key range of end < begin, so
// `blocks` may be negative: below the floor's square nothing is computed.
inline std::int64_t fold_blocks(std::int64_t blocks, std::int64_t serial) {
  constexpr std::int64_t kFloor = 64;
  if (blocks < kFloor * kFloor * serial) return kFloor;
  return static_cast<std::int64_t>(std::sqrt(static_cast<double>(blocks) / static_cast<double>(serial)));
}

// dst = hi * scale[r] + lo for `rows` rows of n floats (ld apart; first: dst =
// lo, hi holding nothing yet), and likewise for the row sums. The level-2
// rescale factors of the online softmax are deferred into `scale` (their
// product since the last fold), so a rescale step costs a multiply per row,
// not a pass over the level-2 accumulator.
template <class S>
inline void fold_level(float* dst, const float* hi, const float* lo, std::int64_t rows, std::int64_t n, std::int64_t ld,
                       float* dst_sum, const float* hi_sum, const float* lo_sum, const float* scale, bool first) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* l = lo + r * ld;
    float* o = dst + r * ld;
    if (first) {
      for (std::int64_t d = 0; d < n; d += S::W) S::store(o + d, S::load(l + d));
      dst_sum[r] = lo_sum[r];
    } else {
      const typename S::V a = S::set1(scale[r]);
      const float* h = hi + r * ld;
      for (std::int64_t d = 0; d < n; d += S::W) S::store(o + d, S::fmadd(S::load(h + d), a, S::load(l + d)));
      dst_sum[r] = std::fma(hi_sum[r], scale[r], lo_sum[r]);
    }
  }
}

template <class S, class E, class KV = E>
void forward_block(const FlashParams& p, std::int64_t b, std::int64_t h, std::int64_t qb, float* scratch) {
  using Tr = KernelTraits<S>;
  using V = typename S::V;
  constexpr std::int64_t BM = Tr::fwd_m, BN = Tr::fwd_n;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const detail::SeqSpan span = p.span(b);
  const std::int64_t i0 = qb * BM, m = std::min(BM, span.q_len - i0);
  if (m <= 0) return;
  const std::int64_t mp = round_up(m, S::W), hk = h / p.group, dqk = p.dqk, dv = p.dv, dvp = round_up(dv, S::W);

  float* qt = scratch;                 // dqk x BM: Q^T, zero-padded columns
  float* kblk = qt + dqk * BM;         // BN x dqk: scale * K block
  float* vblk = kblk + BN * dqk;       // BN x dvp: V block, zero-padded columns
  float* st = vblk + BN * dvp;         // BN x BM: S^T, then P^T
  float* acc = st + BN * BM;           // BM x dvp: output accumulator
  float* row_max = acc + BM * dvp;     // BM
  float* row_sum = row_max + BM;       // BM
  float* alpha = row_sum + BM;         // BM: rescale factor of this step
  float* acc2 = alpha + 2 * BM;        // BM x dvp: level-2 output accumulator (fold_blocks)
  float* sum2 = acc2 + BM * dvp;       // BM: level-2 row sums
  float* scale2 = sum2 + BM;           // BM: level-2 rescale pending since the last fold

  // Keys any row of the block can see: visible ranges only grow with i.
  const detail::KeyRange first = p.keys(i0, span), last = p.keys(i0 + m - 1, span);
  // The first K/V block is asked for before Q is packed, so that its loads
  // overlap the packing's (later blocks are prefetched one block ahead below).
  for (std::int64_t j = first.begin; j < std::min(first.begin + BN, last.end); ++j) {
    prefetch_row(p.k_row<KV>(b, span, j, hk), dqk);
    prefetch_row(p.v_row<KV>(b, span, j, hk), dv);
  }
  pack_transposed<S>(p.q_as<E>() + p.sq.offset(b, span.q_begin + i0, h), p.sq.s, m, mp, dqk, 1.0f, qt, BM);
  std::fill(row_max, row_max + mp, kNegInf);
  std::fill(row_sum, row_sum + mp, 0.0f);
  std::fill(acc, acc + m * dvp, 0.0f);

  const bool plain = p.softcap == 0 && !p.alibi && !p.bias;
  const std::int64_t fold_every = fold_blocks((last.end - first.begin + BN - 1) / BN, 1);
  std::int64_t since_fold = 0;
  bool folded = false;
  // The scale goes on K, as in the backward's S = Q (scale K)^T: each score is
  // then formed from the same products in the same order in both passes (both
  // through dot_blocked, whose chunks of the head dim must agree), the
  // backward's P = exp(s - LSE) is exactly the forward's (1 for a row that sees
  // one key), and dV = P^T dO carries no extra rounding of the scores.
  for (std::int64_t j0 = first.begin; j0 < last.end; j0 += BN) {
    if (since_fold == fold_every) {  // only ever with blocks left: the last fold is after the loop
      fold_level<S>(acc2, acc2, acc, m, dvp, dvp, sum2, sum2, row_sum, scale2, !folded);
      std::fill(acc, acc + m * dvp, 0.0f);
      std::fill(row_sum, row_sum + m, 0.0f);
      std::fill(scale2, scale2 + m, 1.0f);
      folded = true;
      since_fold = 0;
    }
    ++since_fold;
    const std::int64_t n = std::min(BN, last.end - j0);
    V v_bad = S::zero();
    for (std::int64_t j = 0; j < n; ++j) {
      float k_scale = p.scale, v_scale = 1.0f;
      if constexpr (kv8<KV>) {
        const std::int64_t row = span.kv_begin + j0 + j;
        k_scale = p.scale * p.kscale.at(p.pages, b, row, hk);
        v_scale = p.vscale.at(p.pages, b, row, hk);
      }
      v_bad = pack_kv_row<S>(p.k_row<KV>(b, span, j0 + j, hk), p.v_row<KV>(b, span, j0 + j, hk), dqk, dv, dvp, k_scale,
                             v_scale, kblk + j * dqk, vblk + j * dvp, v_bad);
    }
    // Rows of one head are H*D floats apart, too far for the hardware
    // prefetchers: ask for the next block while this one is computed.
    for (std::int64_t j = j0 + BN; j < std::min(j0 + 2 * BN, last.end); ++j) {
      prefetch_row(p.k_row<KV>(b, span, j, hk), dqk);
      prefetch_row(p.v_row<KV>(b, span, j, hk), dv);
    }
    // Only the queries that see some key of this block take part: under a
    // causal or window mask the rest of a diagonal block would be pure waste.
    // [c0, c1) is that query range widened to whole vectors.
    const detail::KeyRange seen_lo = p.queries(j0, span), seen_hi = p.queries(j0 + n - 1, span);
    const std::int64_t c0 = std::max<std::int64_t>(0, seen_lo.begin - i0) / S::W * S::W;
    const std::int64_t c1 = std::min(mp, round_up(std::max<std::int64_t>(0, seen_hi.end - i0), S::W));
    if (c1 <= c0) continue;
    const std::int64_t mc = std::min(m, c1) - c0;  // real queries in the range
    float* sc = st + c0;
    // A plain tile in which every query of the range sees every key needs no pass.
    const bool interior = p.keys(i0 + c0 + mc - 1, span).begin <= j0 && p.keys(i0 + c0, span).end >= j0 + n;
    if (interior) {
      dot_blocked<S, Tr::mr, Tr::nv>(n, c1 - c0, dqk, MatA{kblk, dqk, 1}, qt + c0, BM, sc, BM);
    } else {
      // A diagonal tile, a vector of keys at a time from the first query that
      // sees them (visible query ranges move right with the key), so the
      // triangle above the diagonal costs a vector's width per key, not the
      // block's. finish_logits below masks the scores left out.
      for (std::int64_t u = 0; u < n; u += S::W) {
        const std::int64_t seen = p.queries(j0 + u, span).begin - i0;
        const std::int64_t cu = std::max(c0, std::max<std::int64_t>(0, seen) / S::W * S::W);
        if (cu >= c1) break;
        dot_blocked<S, Tr::mr, Tr::nv>(std::min<std::int64_t>(S::W, n - u), c1 - cu, dqk, MatA{kblk + u * dqk, dqk, 1},
                                       qt + cu, BM, st + u * BM + cu, BM);
      }
    }
    const Tile tile{b, h, i0 + c0, mc, j0, n, span, sc, BM, true, n, c1 - c0};
    if (!(plain && interior)) finish_logits<S, E>(p, tile, nullptr);

    online_softmax_step<S>(st, BM, n, c0, c1, row_max, row_sum, alpha);
    for (std::int64_t r = c0; r < c0 + mc; ++r) {
      if (alpha[r] == 1.0f) continue;
      const V a = S::set1(alpha[r]);
      for (std::int64_t d = 0; d < dvp; d += S::W) S::store(acc + r * dvp + d, S::mul(S::load(acc + r * dvp + d), a));
      if (folded) scale2[r] *= alpha[r];
    }
    // Dropout acts on P after the sums: LSE and normalisation are pre-dropout.
    if (p.dropout) apply_dropout(p, tile);

    // A NaN or infinite v would reach the masked queries through their zero
    // weights in the GEMM (nonfinite_tile.h).
    if (S::reduce_add(v_bad) != 0.0f) {
      visible_pv<S, KV>(p, b, hk, span, i0, c0, c0 + mc, j0, n, st, BM, acc, dvp, 1);
    } else if (interior) {
      gemm<S, Tr::mr, Tr::nv>(mc, dvp, n, MatA{sc, 1, BM}, vblk, dvp, acc + c0 * dvp, dvp, true);
    } else {
      // A diagonal tile, a vector of queries at a time over the keys its last
      // query sees: the keys past them carry zero weights.
      for (std::int64_t r = c0; r < c0 + mc; r += S::W) {
        const std::int64_t mr = std::min<std::int64_t>(S::W, c0 + mc - r);
        const std::int64_t kr = std::clamp<std::int64_t>(p.keys(i0 + r + mr - 1, span).end - j0, 0, n);
        if (kr > 0) gemm<S, Tr::mr, Tr::nv>(mr, dvp, kr, MatA{st + r, 1, BM}, vblk, dvp, acc + r * dvp, dvp, true);
      }
    }
  }

  if (folded) fold_level<S>(acc, acc2, acc, m, dvp, dvp, row_sum, sum2, row_sum, scale2, false);
  // The row ends take the softmax state's place (alpha's is free now).
  const float *lse = row_max, *inv = row_sum, *empty = alpha;
  finish_rows<S>(m, p.sinks(h), row_max, row_sum, alpha);
  for (std::int64_t r = 0; r < m; ++r) {
    const std::int64_t row = span.q_begin + i0 + r;
    store_out_row<E>(p, p.so.offset(b, row, h), acc + r * dvp, inv[r], empty[r] != 0.0f);
    p.lse[p.slse.offset(b, row, h)] = lse[r];
  }
}

// The forward kernels over an 8-bit K/V for each q dtype (KernelTable::q8).
template <class S>
std::array<std::array<DtypeKernels, 3>, 3> q8_forward_kernels() {
  const auto row = [&]<class E>(E*) {
    return std::array<DtypeKernels, 3>{DtypeKernels{&forward_block<S, E, detail::fp8_e4m3_t>},
                                       DtypeKernels{&forward_block<S, E, detail::fp8_e5m2_t>},
                                       DtypeKernels{&forward_block<S, E, std::int8_t>}};
  };
  return {row(static_cast<float*>(nullptr)), row(static_cast<detail::bf16_t*>(nullptr)),
          row(static_cast<detail::f16_t*>(nullptr))};
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
