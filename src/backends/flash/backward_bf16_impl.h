// The bf16 backward of the avx512amx and avx512bf16 families: backward_impl.h's
// algorithm with its five GEMMs on bf16 pairs —
//   Tiles = cpu::AmxTiles (avx512amx) or cpu::AmxTilesEmulated (its exact
//           emulation, cpu/amx_tiles.h): AMX-BF16 tiles (gemm_amx.h)
//   Tiles = void (avx512bf16): vdpbf16ps (gemm_bf16.h), for CPUs with AVX512-BF16
//                and no AMX (AMD Zen 4/5)
// on the same packed operands. Every operand is packed as bf16 pairs along the
// GEMM's depth (A is row-major words, B "VNNI" words [pair][column]):
//   S  = Q K^T      A: Q rows               B: K^T   (K rows transposed as words)
//   dP = dO V^T     A: dO rows              B: V^T   (likewise)
//   dV += P'^T dO   A: P'^T (transposed)    B: dO by pairs of query rows
//   dK += dS^T Q    A: dS^T (transposed)    B: Q by pairs of query rows
//   dQ  = dS K      A: dS rows              B: K by pairs of key rows
// K/V packs are built once per key block and serve every query block of the
// GQA group. P' and dS are rounded to bf16 for their GEMMs (as FlashAttention
// does on GPUs); logits, P, dP, D, the softmax-gradient arithmetic and every
// accumulator (dK, dV, dQ) stay f32, exactly as in backward_impl.h.
// Operand rows and pairs are padded to AMX's multiples of 16 for both engines
// (zeros; vdpbf16ps spends at most a few idle pairs on them).
// Included inside the avx512bf16 + AMX target region of isa_avx512.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"

namespace attend::flash::ATTEND_FLASH_ISA {

// Words (two bf16) of one padded row of `dim` elements: a multiple of 16 pairs.
constexpr std::int64_t amx_pairs(std::int64_t dim) { return round_up((dim + 1) / 2, 16); }

// Extra per-thread floats of the bf16-GEMM backward (after the tiles and the dQ
// sum, flash_backend.cpp).
template <class S>
std::int64_t backward_bf16_extra_floats(std::int64_t dqk, std::int64_t dv) {
  using T = KernelTraits<S>;
  const std::int64_t BM = T::bwd_m, BN = T::bwd_n, kq = amx_pairs(dqk), kv = amx_pairs(dv);
  const std::int64_t dqp = round_up(dqk, 16), dvp = round_up(dv, 16);
  return BN * kq + BN * kv        // K, V rows (bf16, zero-padded)
         + kq * BN + kv * BN      // K^T, V^T as words
         + BN / 2 * dqp           // K by key pairs
         + BM * kq + BM * kv      // Q, dO rows
         + BM / 2 * dqp + BM / 2 * dvp  // Q, dO by query pairs
         + 2 * BN * (BM / 2)      // P'^T, dS^T as words
         + BM * BN / 2            // dS rows as words
         + 64;
}

// rows x dim bf16 (stride ld elements) into zero-padded rows of `words` words.
inline void pad_rows_bf16(const detail::bf16_t* src, std::int64_t ld, std::int64_t rows, std::int64_t rows_pad,
                          std::int64_t dim, std::int64_t words, std::uint32_t* dst) {
  for (std::int64_t r = 0; r < rows_pad; ++r) {
    std::uint32_t* row = dst + r * words;
    std::fill(row, row + words, 0u);
    if (r < rows) std::memcpy(row, src + r * ld, static_cast<std::size_t>(dim) * sizeof(detail::bf16_t));
  }
}

// dst[c][r] = src[r][c] for a rows x cols word matrix (both multiples of 16).
inline void transpose_words(const std::uint32_t* src, std::int64_t lds, std::int64_t rows, std::int64_t cols,
                            std::uint32_t* dst, std::int64_t ldd) {
  for (std::int64_t r0 = 0; r0 < rows; r0 += 16) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
      __m512i w[16];
      for (int i = 0; i < 16; ++i) w[i] = _mm512_loadu_si512(src + (r0 + i) * lds + c0);
      transpose16x16(w);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + (c0 + i) * ldd + r0, w[i]);
    }
  }
}

// Pairs of rows of a bf16 row matrix (words, `words` per row) as VNNI words:
// dst[p][d] = (row 2p [d], row 2p+1 [d]) for d < cols (a multiple of 16).
inline void pair_rows(const std::uint32_t* rows_w, std::int64_t words, std::int64_t pairs, std::int64_t cols,
                      std::uint32_t* dst) {
  const auto* e = reinterpret_cast<const std::uint16_t*>(rows_w);
  for (std::int64_t p = 0; p < pairs; ++p) {
    const std::uint16_t* r0 = e + 2 * p * 2 * words;
    const std::uint16_t* r1 = r0 + 2 * words;
    for (std::int64_t d = 0; d < cols; d += 16) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + d));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + d));
      _mm512_storeu_si512(dst + p * cols + d, interleave_rows(a, c));
    }
  }
}

// A query-major f32 tile (ld floats) as words for a GEMM over queries:
// out[j][qp] = (t[2qp][j], t[2qp+1][j]) for keys j < cols, query pairs qp < qpairs.
inline void pair_columns(const float* t, std::int64_t ld, std::int64_t qpairs, std::int64_t cols, std::uint32_t* out,
                         std::int64_t ldo) {
  for (std::int64_t q0 = 0; q0 < qpairs; q0 += 16) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
      __m512i w[16];
      for (int i = 0; i < 16; ++i) {
        const float* lo = t + 2 * (q0 + i) * ld + c0;
        w[i] = pack_pairs(_mm512_loadu_ps(lo), _mm512_loadu_ps(lo + ld));
      }
      transpose16x16(w);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(out + (c0 + i) * ldo + q0, w[i]);
    }
  }
}

// C[rows x cols] (= or +=) A . B over `pairs` word pairs on the family's engine.
template <class S, class Tiles>
inline void bf16_gemm(std::int64_t rows, std::int64_t cols, std::int64_t pairs, const std::uint32_t* a,
                      std::int64_t lda, const std::uint32_t* b, std::int64_t ldb, float* c, std::int64_t ldc,
                      bool accumulate) {
  if constexpr (!std::is_void_v<Tiles>) {
    amx_gemm<Tiles>(rows, cols, pairs, a, lda, b, ldb, c, ldc, accumulate);
  } else {
    dp_gemm<KernelTraits<S>::mr, KernelTraits<S>::nv>(rows, cols, pairs, MatW{a, lda, 1}, b, ldb, c, ldc, accumulate);
  }
}

template <class S, class Tiles>
void backward_head_bf16_gemm(const FlashParams& p, const BackwardTask& task, float* scratch) {
  constexpr bool kAmx = !std::is_void_v<Tiles>;
  static_assert(S::W == 16, "bf16-GEMM kernels are AVX-512 only");
  using Tr = KernelTraits<S>;
  using V = typename S::V;
  using detail::bf16_t;
  constexpr std::int64_t BM = Tr::bwd_m, BN = Tr::bwd_n;
  static_assert(BM % 32 == 0 && BN % 32 == 0);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const std::int64_t b = task.b, hk = task.hk;
  const detail::SeqSpan span = p.span(b);
  const std::int64_t dqk = p.dqk, dv = p.dv, dqp = round_up(dqk, S::W), dvp = round_up(dv, S::W);
  const std::int64_t kq = amx_pairs(dqk), kv = amx_pairs(dv);
  if constexpr (kAmx) Tiles::configure();
  const auto gemm = bf16_gemm<S, Tiles>;

  // backward_impl.h's f32 tiles (only the ones used here)...
  float* dk_acc = scratch + dqk * BN + dv * BN + BN * dqp;  // BN x dqp
  float* dv_acc = dk_acc + BN * dqp;                        // BN x dvp
  float* pt = dv_acc + BN * dvp + BM * dqp + BM * dvp;      // BM x BN   P, then P'
  float* ds = pt + BM * BN;                                 // BM x BN   dP, then scale * dS
  float* th = ds + BM * BN;                                 // BM x BN   1 - tanh^2 (softcap only)
  float* dq_tile = th + BM * BN;                            // BM x dqp
  float* dsum = dq_tile + BM * dqp;                         // BM
  float* lse = dsum + BM;                                   // BM
  // ... the f32 dQ sum of the group (none when dq is f32), then the packed bf16 operands.
  auto* kb = reinterpret_cast<std::uint32_t*>(scratch + backward_scratch_floats<S>(dqk, dv) +
                                              (p.dq_f32 ? 0 : p.group * p.seqlen_q * dqk));
  std::uint32_t* vb = kb + BN * kq;
  std::uint32_t* kt2 = vb + BN * kv;
  std::uint32_t* vt2 = kt2 + kq * BN;
  std::uint32_t* k2 = vt2 + kv * BN;
  std::uint32_t* qb = k2 + BN / 2 * dqp;
  std::uint32_t* dob = qb + BM * kq;
  std::uint32_t* q2 = dob + BM * kv;
  std::uint32_t* do2 = q2 + BM / 2 * dqp;
  std::uint32_t* pT2 = do2 + BM / 2 * dvp;
  std::uint32_t* dsT2 = pT2 + BN * (BM / 2);
  std::uint32_t* dsb = dsT2 + BN * (BM / 2);

  zero_dq_accum<S>(p, task, span, scratch);  // this task owns these dQ rows

  for (std::int64_t j0 = 0; j0 < span.kv_len; j0 += BN) {
    const std::int64_t n = std::min(BN, span.kv_len - j0), np = round_up(n, 32);
    const bf16_t* ksrc = static_cast<const bf16_t*>(p.k) + p.sk.offset(b, span.kv_begin + j0, hk);
    const bf16_t* vsrc = static_cast<const bf16_t*>(p.v) + p.sv.offset(b, span.kv_begin + j0, hk);
    pad_rows_bf16(ksrc, p.sk.s, n, np, dqk, kq, kb);
    pad_rows_bf16(vsrc, p.sv.s, n, np, dv, kv, vb);
    transpose_words(kb, kq, np, kq, kt2, np);  // K^T: [pair of dims][key]
    transpose_words(vb, kv, np, kv, vt2, np);
    pair_rows(kb, kq, np / 2, dqp, k2);         // K by key pairs: [key pair][dim]
    std::fill(dk_acc, dk_acc + np * dqp, 0.0f);
    std::fill(dv_acc, dv_acc + np * dvp, 0.0f);

    for (std::int64_t g = task.g_begin; g < task.g_end; ++g) {
      const std::int64_t h = hk * p.group + g;
      for (std::int64_t i0 = 0; i0 < span.q_len; i0 += BM) {
        const std::int64_t m = std::min(BM, span.q_len - i0), mp = round_up(m, 32);
        const detail::KeyRange first = p.keys(i0, span), last = p.keys(i0 + m - 1, span);
        if (first.begin >= j0 + n || last.end <= j0 || last.end <= first.begin) continue;

        const std::int64_t row0 = span.q_begin + i0;
        pad_rows_bf16(p.q_as<bf16_t>() + p.sq.offset(b, row0, h), p.sq.s, m, mp, dqk, kq, qb);
        pad_rows_bf16(p.dout_as<bf16_t>() + p.sdo.offset(b, row0, h), p.sdo.s, m, mp, dv, kv, dob);
        pair_rows(qb, kq, mp / 2, dqp, q2);
        pair_rows(dob, kv, mp / 2, dvp, do2);
        for (std::int64_t r = 0; r < m; ++r) {
          dsum[r] = dot<S>(p.dout_as<bf16_t>() + p.sdo.offset(b, row0 + r, h),
                           p.out_as<bf16_t>() + p.so.offset(b, row0 + r, h), dv);
          lse[r] = p.lse[p.slse.offset(b, row0 + r, h)];
        }
        nan_unless_finite(dsum, m);
        prefetch_next_block<S, bf16_t>(p, task, span, scratch, BM, BN, g, i0, j0);

        // Keys [j0 + c0, j0 + c0 + nk) are the ones some row sees; a diagonal
        // tile stops at its last visible key (backward_impl.h). [c0, c0 + nc)
        // is that range widened to whole pairs of 16 words (AMX's tile width).
        const std::int64_t c0 = std::max<std::int64_t>(0, first.begin - j0) / 32 * 32;
        const std::int64_t c1 = std::min(n, last.end - j0), nk = c1 - c0, nc = round_up(c1, 32) - c0;
        float *t_p = pt + c0, *t_ds = ds + c0, *t_th = th + c0;

        // S = Q K^T (scaled in f32), final logits, P = exp(s - LSE); padding rows 0.
        // Non-finite inputs show in S, dP, the LSE or D (backward_impl.h).
        gemm(mp, nc, kq, qb, kq, kt2 + c0, np, t_p, BN, false);
        bool finite = tile_finite<S>(t_p, m, nc, BN) && lse_and_d_clean(lse, dsum, m);
        const V vscale = S::set1(p.scale);
        for (std::int64_t r = 0; r < m; ++r) {
          for (std::int64_t j = 0; j < nc; j += S::W)
            S::store(t_p + r * BN + j, S::mul(S::load(t_p + r * BN + j), vscale));
        }
        const Tile tile{b, h, i0, m, j0 + c0, nk, span, t_p, BN, false, m, nc};
        finish_logits<S, bf16_t>(p, tile, p.softcap > 0 ? t_th : nullptr);
        for (std::int64_t r = 0; r < mp; ++r) {
          float* row = t_p + r * BN;
          if (r >= m || lse[r] == kNegInf) {
            std::fill(row, row + nc, 0.0f);
            continue;
          }
          const V vl = S::set1(lse[r]);
          for (std::int64_t j = 0; j < nc; j += S::W) S::store(row + j, S::exp(S::sub(S::load(row + j), vl)));
        }

        // dP = dO V^T (* keep/(1-p)); scale * dS = scale * P * (dP - D) [* (1 - tanh^2)]
        gemm(mp, nc, kv, dob, kv, vt2 + c0, np, t_ds, BN, false);
        finite = finite && tile_finite<S>(t_ds, m, nc, BN);
        const Tile dtile{b, h, i0, m, j0 + c0, nk, span, t_ds, BN, false, m, nc};
        if (p.dropout) apply_dropout(p, dtile);
        for (std::int64_t r = 0; r < mp; ++r) {
          if (r >= m) {
            std::fill(t_ds + r * BN, t_ds + r * BN + nc, 0.0f);
            continue;
          }
          const V vd = S::set1(dsum[r]);
          for (std::int64_t j = 0; j < nc; j += S::W) {
            const std::int64_t o = r * BN + j;
            V g_s = S::mul(S::load(t_p + o), S::sub(S::load(t_ds + o), vd));
            if (p.softcap > 0) g_s = S::mul(g_s, S::load(t_th + o));
            S::store(t_ds + o, S::mul(g_s, vscale));
          }
        }
        if (p.dropout) apply_dropout(p, tile);  // P -> P' for dV

        // dV += P'^T dO;  dK += (scale dS)^T Q;  dQ = (scale dS) K
        float *t_dv = dv_acc + c0 * dvp, *t_dk = dk_acc + c0 * dqp;
        if (!finite) {
          visible_tile_products<S, bf16_t>(p, b, h, span, i0, m, j0 + c0, nk, t_p, t_ds, BN, lse, t_dv, dvp, t_dk, dqp,
                                           dq_tile);
          add_dq_tile<S>(p, b, hk, span, scratch, g, i0, m, dq_tile, dqp);
          continue;
        }
        pair_columns(t_p, BN, mp / 2, nc, pT2, BM / 2);
        pair_columns(t_ds, BN, mp / 2, nc, dsT2, BM / 2);
        gemm(nc, dvp, round_up(mp / 2, 16), pT2, BM / 2, do2, dvp, t_dv, dvp, true);
        gemm(nc, dqp, round_up(mp / 2, 16), dsT2, BM / 2, q2, dqp, t_dk, dqp, true);
        for (std::int64_t r = 0; r < mp; ++r) {
          for (std::int64_t j = 0; j < nc; j += 32) {
            const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(t_ds + r * BN + j + 16),
                                                           _mm512_loadu_ps(t_ds + r * BN + j));
            _mm512_storeu_si512(dsb + r * (BN / 2) + j / 2, w);
          }
        }
        gemm(mp, dqp, nc / 2, dsb, BN / 2, k2 + c0 / 2 * dqp, dqp, dq_tile, dqp, false);
        add_dq_tile<S>(p, b, hk, span, scratch, g, i0, m, dq_tile, dqp);
      }
    }
    emit_kv_grads<S, bf16_t>(p, task, span, j0, n, dk_acc, dqp, dv_acc, dvp);
  }

  store_dq_accum<S, bf16_t>(p, task, span, scratch);
  if constexpr (kAmx) Tiles::release();
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
