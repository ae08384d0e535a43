// The decode kernels for one ISA: one split of one (sequence, kv head), and the
// exact LSE combine of the splits. Included inside namespace
// attend::decode::ATTEND_DECODE_ISA after one of flash's simd_*.h headers.
//
// A split streams its keys in blocks of kBlockN, reading K and V rows in place
// (dense, varlen or paged) — each row is read once for all the query rows of
// the GQA group. Rows of one kv head sit heads_kv * D floats apart (a page
// apart at each page boundary), beyond what hardware prefetchers follow, so the
// next block's rows are prefetched explicitly while this one is computed.
//
// Every kernel is a template on the element type E of q/bias/out (float,
// bf16_t, f16_t) and KV of k/v (E, or an 8-bit code: fp8_e4m3_t, fp8_e5m2_t,
// int8_t): K/V rows are widened to f32 as they are loaded (cpu/half_simd.h),
// so a bf16/f16 cache streams half the bytes of an f32 one and an 8-bit cache a
// quarter, while all arithmetic, the partials and the LSE stay f32 (but for
// bf16 queries on AVX512-BF16: exact bf16 products of q and K, and of P
// rounded to bf16 and V, summed in f32 by vdpbf16ps). An 8-bit
// cache's scales never touch the codes: code * k_scale enters a score as
// (q . code) * k_scale, one multiply per score, and code * v_scale as the
// weight P * v_scale of the code row, one multiply per probability.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backends/decode/decode_params.h"
#include "backends/decode/decode_simd.h"
#include "cpu/half_simd.h"
#include "kernel/lse_merge.h"

namespace attend::decode::ATTEND_DECODE_ISA {

using Simd = ATTEND_DECODE_SIMD;
using V = typename Simd::V;
constexpr int W = Simd::W;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
using detail::load_f32;
using detail::to_f32;

// Keys per score tile for R query rows: a tile's R x KB sums fill one vector
// (R = 3 runs in the 4-row shape with one row idle).
template <int R>
constexpr int tile_keys() {
  if constexpr (W == 1) return 4;
  return W / (R == 3 ? 4 : R);
}

// s[r * kBlockN + c] = <q_r, k_c> for R query rows and KB keys. Each K vector
// is loaded (and widened) once and applied to all R rows from registers; the
// R * KB accumulators hide the FMA latency and are summed by one
// transpose-and-add tree, whose vector of sums is stored row by row.
template <int R, int KB, class E>
[[gnu::always_inline]] inline void dot_tile(const float* q, std::int64_t ldq, const E* const* k, std::int64_t dqk,
                                            float* s) {
  constexpr int RS = W == 1 ? R : W / KB;  // rows of the tile's shape
  static_assert(R <= RS && (W == 1 || RS * KB == W));
  const std::int64_t dvec = dqk / W * W;
  V acc[RS * KB];
  for (int i = 0; i < RS * KB; ++i) acc[i] = Simd::zero();
  for (std::int64_t d = 0; d < dvec; d += W) {
    V kv[KB];
    for (int c = 0; c < KB; ++c) kv[c] = load_f32<Simd>(k[c] + d);
    for (int r = 0; r < R; ++r) {
      const V qv = Simd::load(q + r * ldq + d);
      for (int c = 0; c < KB; ++c) acc[r * KB + c] = Simd::fmadd(qv, kv[c], acc[r * KB + c]);
    }
  }
  if constexpr (W == 1) {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < KB; ++c) s[r * kBlockN + c] = acc[r * KB + c];
  } else {
    simd::store_tile<Simd, KB, R>(s, kBlockN, simd::sum_lanes<Simd>(acc));
  }
  if (dvec < dqk) {
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < KB; ++c) {
        float x = s[r * kBlockN + c];
        // Explicit fma: the same rounding whatever the element type (contraction of
        // x += a * b is otherwise the compiler's choice, and differs per type).
        for (std::int64_t d = dvec; d < dqk; ++d) x = std::fma(q[r * ldq + d], to_f32(k[c][d]), x);
        s[r * kBlockN + c] = x;
      }
    }
  }
}

template <class E>
inline void prefetch_rows(const E* const* rows, std::int64_t n, std::int64_t dim) {
  constexpr std::int64_t kLine = 64 / static_cast<std::int64_t>(sizeof(E));  // elements per cache line
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t d = 0; d < dim; d += kLine) __builtin_prefetch(rows[j] + d, 0, 1);
  }
}

#if defined(ATTEND_DECODE_BF16_DOT)
// dot_tile for a bf16 cache on AVX512-BF16 (the avx512bf16 family's TU sets
// ATTEND_DECODE_BF16_DOT): vdpbf16ps multiplies 16 pairs of bf16 exactly and
// adds both products to f32 lanes, so K rows are used as loaded, without
// widening, at half the instructions per multiply-add. The q rows hold the
// query as given (bf16, unscaled, zero-padded to whole vectors) and the scale
// multiplies the f32 sums, as in flash's bf16 kernels; vdpbf16ps reads bf16
// denormals as 0. ldq counts bf16 elements; K's last partial vector is a
// masked load, so nothing past a row is read. (An 8-bit cache with bf16
// queries comes here too, its block's codes converted to bf16 rows first:
// split_task.)
inline constexpr bool kPairScores = true;

template <int R, int KB>
[[gnu::always_inline]] inline void dot_tile_pairs(const detail::bf16_t* q, std::int64_t ldq,
                                                  const detail::bf16_t* const* k, std::int64_t dqk, float scale,
                                                  float* s) {
  constexpr int RS = W / KB;
  constexpr std::int64_t kPerVec = 2 * W;  // bf16 per vector
  static_assert(W == 16 && R <= RS && RS * KB == W);
  V acc[RS * KB];
  for (int i = 0; i < RS * KB; ++i) acc[i] = Simd::zero();
  const auto step = [&](std::int64_t d, __mmask32 live) {
    __m512bh kv[KB];
    for (int c = 0; c < KB; ++c) kv[c] = (__m512bh)_mm512_maskz_loadu_epi16(live, k[c] + d);
    for (int r = 0; r < R; ++r) {
      const auto qv = (__m512bh)_mm512_loadu_si512(q + r * ldq + d);
      for (int c = 0; c < KB; ++c) acc[r * KB + c] = _mm512_dpbf16_ps(acc[r * KB + c], qv, kv[c]);
    }
  };
  std::int64_t d = 0;
  for (; d + kPerVec <= dqk; d += kPerVec) step(d, ~__mmask32{0});
  if (d < dqk) step(d, static_cast<__mmask32>((std::uint64_t{1} << (dqk - d)) - 1));
  simd::store_tile<Simd, KB, R>(s, kBlockN, Simd::mul(simd::sum_lanes<Simd>(acc), Simd::set1(scale)));
}

// bf16 bits of the e4m3 magnitude m (0..127; 0x7f is NaN): every e4m3 value
// is a bf16. Normal codes move their exponent and mantissa fields over;
// subnormals (m / 8 * 2^-6) are normalised.
constexpr std::uint16_t e4m3_magnitude_bf16(unsigned m) {
  const unsigned e = m >> 3, f = m & 7;
  if (m == 0x7f) return 0x7fc0;
  if (e != 0) return static_cast<std::uint16_t>(((e + 120) << 7) | (f << 4));
  if (f == 0) return 0;
  const unsigned k = f >= 4 ? 2 : f >= 2 ? 1 : 0;  // f = 2^k + rest
  return static_cast<std::uint16_t>(((118 + k) << 7) | ((f - (1u << k)) << (7 - k)));
}

// The dims [d, d + 32) of an n-element row that exist, as a mask.
inline __mmask32 live32(std::int64_t d, std::int64_t n) {
  return d >= n ? 0 : n - d >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << (n - d)) - 1);
}

// 32 e4m3 codes (those in `live`; the others 0) as bf16 words: the 7-bit
// magnitude looked up in a 128-entry table (two vpermt2w of 64 entries, bit 6
// picks) and the sign moved from bit 7 to bit 15 — 7 operations per 32 codes,
// where the f32 widening (load_f32) takes 7 per 16 and a rounding to bf16.
inline __m512i e4m3_bf16x32(const detail::fp8_e4m3_t* src, __mmask32 live) {
  alignas(64) static constexpr std::array<std::uint16_t, 128> kBits = [] {
    std::array<std::uint16_t, 128> t{};
    for (unsigned m = 0; m < 128; ++m) t[m] = e4m3_magnitude_bf16(m);
    return t;
  }();
  const __m512i c = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(live, src));
  const auto table = [&](int i) { return _mm512_load_si512(kBits.data() + 32 * i); };
  const __m512i low = _mm512_permutex2var_epi16(table(0), c, table(1));
  const __m512i high = _mm512_permutex2var_epi16(table(2), c, table(3));
  const __m512i mag = _mm512_mask_mov_epi16(low, _mm512_test_epi16_mask(c, _mm512_set1_epi16(0x40)), high);
  // mag | ((c << 8) & 0x8000)
  return _mm512_ternarylogic_epi32(mag, _mm512_slli_epi16(c, 8), _mm512_set1_epi16(static_cast<short>(0x8000)), 0xf8);
}

// 32 bf16 elements of a row (those in `live`; the others 0): a bf16 row as
// it is, an e4m3 row through its table.
template <class KV>
inline __m512i bf16x32(const KV* row, __mmask32 live) {
  if constexpr (std::is_same_v<KV, detail::bf16_t>) {
    return _mm512_maskz_loadu_epi16(live, row);
  } else {
    static_assert(std::is_same_v<KV, detail::fp8_e4m3_t>);
    return e4m3_bf16x32(row, live);
  }
}

// P V on vdpbf16ps too (bf16 queries): the block's V is laid out once as key
// pairs — pair row k2 holds (v[2 k2][d], v[2 k2 + 1][d]) side by side for each
// of dvp dims, vdpbf16ps's operand — and a row's P as bf16 pairs, so two keys
// times 16 dims take one vdpbf16ps against two widenings and two FMAs in f32,
// for every query row of the group. P is rounded to bf16 as flash's bf16
// kernels round it (its sum, the LSE and the normalisation stay f32).
//
// dst (npairs rows of dvp u32) = the pairs of rows v[0, n); a missing key
// (n odd) and the dims past dv are zero. `next`'s nn rows are asked for on
// the way (NextBlock's reason: a few at a time). Every 8-bit code is a bf16,
// so its f32 widening's high half is exact.
template <class KV>
inline void pair_block(const KV* const* v, std::int64_t n, std::int64_t dv, std::int64_t dvp, std::uint32_t* dst,
                       const KV* const* next, std::int64_t nn) {
  for (std::int64_t k2 = 0; 2 * k2 < n; ++k2) {
    const KV* a = v[2 * k2];
    const KV* b = 2 * k2 + 1 < n ? v[2 * k2 + 1] : nullptr;
    std::uint32_t* out = dst + k2 * dvp;
    if (2 * k2 < nn) prefetch_rows(next + 2 * k2, std::min<std::int64_t>(2, nn - 2 * k2), dv);
    std::int64_t d = 0;
    if constexpr (std::is_same_v<KV, detail::bf16_t> || std::is_same_v<KV, detail::fp8_e4m3_t>) {
      // Even dims' words from a, odd from b: vpermt2w of a 32-dim row pair.
      alignas(64) static constexpr std::uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                            37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                            11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
      const __m512i lo = _mm512_load_si512(kLo), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
      for (; d < dvp; d += 32) {
        const __mmask32 live = live32(d, dv);
        const __m512i x = bf16x32(a + d, live);
        const __m512i y = b ? bf16x32(b + d, live) : _mm512_setzero_si512();
        _mm512_storeu_si512(out + d, _mm512_permutex2var_epi16(x, lo, y));
        if (d + 16 < dvp) _mm512_storeu_si512(out + d + 16, _mm512_permutex2var_epi16(x, hi, y));
      }
    } else {
      const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
      for (; d + W <= dv; d += W) {
        const __m512i x = _mm512_castps_si512(load_f32<Simd>(a + d));
        const __m512i y = b ? _mm512_castps_si512(load_f32<Simd>(b + d)) : _mm512_setzero_si512();
        // (x >> 16) | (y & 0xffff0000): select by `high`, bit by bit.
        _mm512_storeu_si512(out + d, _mm512_ternarylogic_epi32(high, _mm512_srli_epi32(x, 16), y, 0xac));
      }
      for (; d < dvp; ++d) {
        const auto bits = [&](const KV* row) -> std::uint32_t {
          return row && d < dv ? detail::from_f32<detail::bf16_t>(to_f32(row[d])).bits : 0u;
        };
        out[d] = bits(a) | bits(b) << 16;
      }
    }
  }
}

// acc_r += P_r V over the block's npairs key pairs for R rows; pp: row r's P
// pairs at pp + r * kBlockN (u32 each). Each pair vector serves R rows.
template <int R, int NV>
[[gnu::always_inline]] inline std::int64_t pv_pair_panel(std::int64_t d, std::int64_t dvp, const std::uint32_t* pp,
                                                         const std::uint32_t* vp, std::int64_t npairs, float* acc,
                                                         std::int64_t lda) {
  for (; d + NV * W <= dvp; d += NV * W) {
    V a[R][NV];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < NV; ++u) a[r][u] = Simd::load(acc + r * lda + d + u * W);
    for (std::int64_t k2 = 0; k2 < npairs; ++k2) {
      __m512bh vv[NV];
      for (int u = 0; u < NV; ++u) vv[u] = (__m512bh)_mm512_loadu_si512(vp + k2 * dvp + d + u * W);
      for (int r = 0; r < R; ++r) {
        const auto pj = (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[r * kBlockN + k2]));
        for (int u = 0; u < NV; ++u) a[r][u] = _mm512_dpbf16_ps(a[r][u], pj, vv[u]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < NV; ++u) Simd::store(acc + r * lda + d + u * W, a[r][u]);
  }
  return d;
}

template <int R>
inline void pv_pairs(const std::uint32_t* pp, const std::uint32_t* vp, std::int64_t npairs, std::int64_t dvp,
                     float* acc, std::int64_t lda) {
  std::int64_t d = pv_pair_panel<R, 4>(0, dvp, pp, vp, npairs, acc, lda);
  pv_pair_panel<R, 1>(d, dvp, pp, vp, npairs, acc, lda);  // dvp is a multiple of W
}

// Row r's f32 probabilities as bf16 pairs, in place at the row's start.
inline void pairs_of_row(float* s) {
  static_assert(kBlockN == W);
  const __m256bh h = _mm512_cvtneps_pbh(Simd::load(s));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(s), (__m256i)h);
}
#else
inline constexpr bool kPairScores = false;
#endif

// Whether q of E over a cache of KV takes dot_tile_pairs; its q rows then hold E as given.
template <class E, class KV>
inline constexpr bool pair_scores = kPairScores&& std::is_same_v<E, detail::bf16_t> &&
                                    (std::is_same_v<KV, E> || sizeof(KV) == 1);

// What an 8-bit cache's K block is converted to before its block_step: bf16
// where the scores take vdpbf16ps (bf16 queries), else f32. (V's: f32, which
// P V then reads with no conversion of its own.)
template <class E, class KV>
using Converted = std::conditional_t<pair_scores<E, KV>, detail::bf16_t, float>;

// dst[0, n) = the codes src[0, n) widened exactly (to f32, or bf16: every code is one).
template <class C, class KV>
inline void widen_row(const KV* src, std::int64_t n, C* dst) {
#if defined(ATTEND_DECODE_BF16_DOT)
  if constexpr (std::is_same_v<C, detail::bf16_t> && std::is_same_v<KV, detail::fp8_e4m3_t>) {
    for (std::int64_t d = 0; d < n; d += 32) {
      _mm512_mask_storeu_epi16(dst + d, live32(d, n), e4m3_bf16x32(src + d, live32(d, n)));
    }
    return;
  }
#endif
  std::int64_t d = 0;
  for (; d + W <= n; d += W) {
    if constexpr (std::is_same_v<C, float>) {
      Simd::store(dst + d, load_f32<Simd>(src + d));
    } else {
#if defined(ATTEND_DECODE_BF16_DOT)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), (__m256i)_mm512_cvtneps_pbh(load_f32<Simd>(src + d)));
#endif
    }
  }
  for (; d < n; ++d) dst[d] = detail::from_f32<C>(to_f32(src[d]));
}

// The next block's K and V rows, asked for a few rows at a time while this
// block is computed: K rows after each score tile, V rows along the first
// P V panel. (Asked for all at once, 256 lines per block in f32, the
// prefetches queue in the core's miss buffers and stall the instructions
// behind them: a split then took the sum of its compute and memory time,
// 55 % of the read bandwidth in f32, against 75-87 % spread out.)
template <class K, class Vt = K>
struct NextBlock {
  const K* const* k = nullptr;
  const Vt* const* v = nullptr;
  std::int64_t n = 0;  // rows; 0 when there is no next block (or it was asked for)
};

// q: m rows, ldq floats apart: scale * q in f32, or (Pairs) q as given in
// bf16, unscaled; the scale is then applied to the sums.
template <int R, class E, bool Pairs, class Next>
inline void score_rows(const float* q, std::int64_t ldq, const E* const* k, std::int64_t dqk,
                       [[maybe_unused]] float scale, float* s, const Next& next) {
  constexpr int KB = tile_keys<R>();
  static_assert(kBlockN % KB == 0);
  for (std::int64_t c = 0; c < kBlockN; c += KB) {
    if constexpr (Pairs) {
#if defined(ATTEND_DECODE_BF16_DOT)
      dot_tile_pairs<R, KB>(reinterpret_cast<const detail::bf16_t*>(q), 2 * ldq, k + c, dqk, scale, s + c);
#endif
    } else {
      dot_tile<R, KB, E>(q, ldq, k + c, dqk, s + c);
    }
    if (c < next.n) prefetch_rows(next.k + c, std::min<std::int64_t>(KB, next.n - c), dqk);
  }
}

// Row r's scores times the per-key K scales (an 8-bit cache), before any logit term.
inline void scale_scores(float* s, std::int64_t m, const float* ksc) {
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t c = 0; c < kBlockN; c += W)
      Simd::store(s + r * kBlockN + c, Simd::mul(Simd::load(s + r * kBlockN + c), Simd::load(ksc + c)));
  }
}

// Scores of m rows against a whole block of kBlockN keys (the caller pads a
// short block with repeats of a valid row; those columns are masked after).
// Rows go four at a time, so the block's K rows are streamed from L1 once per
// four query rows rather than once per row. The first rows ask for the next
// block's K rows.
template <class E, bool Pairs, class Next>
inline void scores(const float* q, std::int64_t ldq, std::int64_t m, const E* const* k, std::int64_t dqk, float scale,
                   float* s, Next next) {
  std::int64_t r = 0;
  for (; r + 4 <= m; r += 4, next.n = 0) {
    score_rows<4, E, Pairs>(q + r * ldq, ldq, k, dqk, scale, s + r * kBlockN, next);
  }
  const float* qr = q + r * ldq;
  float* sr = s + r * kBlockN;
  switch (m - r) {
    case 3: score_rows<3, E, Pairs>(qr, ldq, k, dqk, scale, sr, next); break;
    case 2: score_rows<2, E, Pairs>(qr, ldq, k, dqk, scale, sr, next); break;
    case 1: score_rows<1, E, Pairs>(qr, ldq, k, dqk, scale, sr, next); break;
    default: break;
  }
}

// acc_r += sum_j p[r][j] * v_j for R rows; each V load serves R rows. The
// panel at d = 0 asks for the next block's V row j beside its own row j.
template <int R, int NV, class E, class Next>
[[gnu::always_inline]] inline std::int64_t pv_panel(std::int64_t d, std::int64_t dvec, const float* p,
                                                    const E* const* v, std::int64_t n, float* acc, std::int64_t lda,
                                                    const Next& next, std::int64_t dv) {
  for (; d + NV * W <= dvec; d += NV * W) {
    V a[R][NV];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < NV; ++u) a[r][u] = Simd::load(acc + r * lda + d + u * W);
    for (std::int64_t j = 0; j < n; ++j) {
      if (d == 0 && j < next.n) prefetch_rows(next.v + j, 1, dv);
      V vv[NV];
      for (int u = 0; u < NV; ++u) vv[u] = load_f32<Simd>(v[j] + d + u * W);
      for (int r = 0; r < R; ++r) {
        const V pj = Simd::set1(p[r * kBlockN + j]);
        for (int u = 0; u < NV; ++u) a[r][u] = Simd::fmadd(pj, vv[u], a[r][u]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < NV; ++u) Simd::store(acc + r * lda + d + u * W, a[r][u]);
  }
  return d;
}

// Asks for all of `next`'s V rows (those the panel at d = 0 did not).
template <int R, class E, class Next>
inline void pv_rows(const float* p, const E* const* v, std::int64_t n, std::int64_t dv, float* acc, std::int64_t lda,
                    const Next& next) {
  // R * NV accumulators plus NV loaded vectors must fit the register file
  // (16 on AVX2, 32 on AVX-512).
  constexpr int NV = W == 8 && R > 2 ? 2 : 4;
  const std::int64_t dvec = dv / W * W;
  std::int64_t d = pv_panel<R, NV, E>(0, dvec, p, v, n, acc, lda, next, dv);
  d = pv_panel<R, 1, E>(d, dvec, p, v, n, acc, lda, next, dv);
  const std::int64_t asked = dvec > 0 ? std::min(n, next.n) : 0;
  prefetch_rows(next.v + asked, next.n - asked, dv);
  for (; d < dv; ++d) {
    for (int r = 0; r < R; ++r) {
      float x = acc[r * lda + d];
      for (std::int64_t j = 0; j < n; ++j) x = std::fma(p[r * kBlockN + j], to_f32(v[j][d]), x);
      acc[r * lda + d] = x;
    }
  }
}

// Where a finished row goes: straight to out/lse when the sequence has one
// split, else to the split's partial slot for the combine.
template <class E>
struct RowSink {
  const DecodeParams& p;
  std::int64_t b, hk, split;
  bool direct;
  void write(std::int64_t r, const float* acc, float m, float l) const {
    const std::int64_t i = r / p.group, h = hk * p.group + r % p.group;
    // l = 0: an empty row (no visible key, or every logit -inf) has O = 0 and
    // LSE = -inf whatever it met; a NaN sum (NaN or +inf logit) makes both NaN.
    // The sink logit joins a row once: here when the sequence has one split,
    // else in combine_task, so a split's partial is a vanilla softmax.
    const detail::RowFinish<float> f = detail::finish_row(m, l, direct ? p.sinks(h) : kNegInf);
    const bool empty = f.empty;
    const float inv = f.inv, lse = f.lse;
    if (direct) {
      const std::int64_t row = p.span(b).q_begin + i;
      E* dst = static_cast<E*>(p.out) + p.so.offset(b, row, h);
      for (std::int64_t d = 0; d < p.dv; ++d) dst[d] = detail::from_f32<E>(empty ? 0.0f : acc[d] * inv);
      p.lse[p.slse.offset(b, row, h)] = lse;
    } else {
      float* dst = p.partial_out(b, hk, split) + r * p.plan.dvp;
      for (std::int64_t d = 0; d < p.dv; ++d) dst[d] = empty ? 0.0f : acc[d] * inv;
      p.partial_lse(b, hk, split)[r] = lse;
    }
  }
};

// Softcap, ALiBi, bias and the mask of one row's block of scores, in the order
// of the spec: softcap(s), + alibi, + bias, -inf outside [lo, hi).
template <class E>
inline void finish_row(const DecodeParams& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0,
                       std::int64_t lo, std::int64_t hi, float* s) {
  if (p.softcap > 0) {
    const V inv = Simd::set1(1.0f / p.softcap), cap = Simd::set1(p.softcap);
    for (std::int64_t c = 0; c < kBlockN; c += W) Simd::store(s + c, Simd::mul(Simd::tanh(Simd::mul(Simd::load(s + c), inv)), cap));
  }
  if (p.slopes.data) {
    const float slope = p.slopes(b, h);
    const std::int64_t pos = i + p.alibi_shift(p.span(b));
    for (std::int64_t c = lo; c < hi; ++c) s[c] -= slope * static_cast<float>(std::llabs(pos - (j0 + c)));
  }
  if (p.bias) {
    const E* brow = static_cast<const E*>(p.bias) + p.sbias.offset(b, h, i) + j0;
    for (std::int64_t c = lo; c < hi; ++c) s[c] += to_f32(brow[c]);
  }
  for (std::int64_t c = 0; c < lo; ++c) s[c] = kNegInf;
  for (std::int64_t c = hi; c < kBlockN; ++c) s[c] = kNegInf;
}

// One kv head's running state inside a task, carved from the thread's scratch.
struct HeadState {
  float* qs;       // m x ldq: scale * q, zero-padded (or q as given: score_rows)
  float* s;        // m x kBlockN: scores, then probabilities
  float* acc;      // m x lda: unnormalised output
  float* row_max;  // m
  float* row_sum;  // m
  // Level 2 of the output and the row sums (fold_blocks): acc and row_sum
  // are folded into them every few blocks and emptied; scale2 is the product
  // of the rescale factors met since the last fold, which level 2 still owes.
  float* acc2;    // m x lda
  float* sum2;    // m
  float* scale2;  // m
};

inline HeadState carve(const DecodeParams& p, float* base) {
  const std::int64_t rows = p.plan.max_rows;
  HeadState h;
  h.qs = base;
  h.s = h.qs + rows * p.plan.dqkp;
  h.acc = h.s + rows * kBlockN;
  h.row_max = h.acc + rows * p.plan.dvp;
  h.row_sum = h.row_max + rows;
  h.acc2 = h.row_sum + rows;
  h.sum2 = h.acc2 + rows * p.plan.dvp;
  h.scale2 = h.sum2 + rows;
  return h;
}

// Keys [j0, j0 + n) of kv head hk for its m query rows (r = i * group + g):
// scores, mask and logit terms, online softmax, P V; meanwhile the rows of
// `next` are asked for. ksc/vsc: the keys' scales (an 8-bit cache with
// scales; kBlockN entries, padding 1), else null. vpairs: the block's V as
// key pairs (pair_block) where P V takes vdpbf16ps, else null; vr then still
// serves the rows that see part of the block, and next.v is not asked for.
template <class E, class KV, class VV>
inline void block_step(const DecodeParams& p, std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t n,
                       const KV* const* kr, const VV* const* vr, const HeadState& st, NextBlock<KV, VV> next,
                       const float* ksc, const float* vsc, [[maybe_unused]] const std::uint32_t* vpairs) {
  const detail::SeqSpan sp = p.span(b);
  const std::int64_t g = p.group, m = g * sp.q_len, lda = p.plan.dvp;
  const bool plain = p.softcap == 0 && !p.slopes.data && !p.bias;
  scores<KV, pair_scores<E, KV>>(st.qs, p.plan.dqkp, m, kr, p.dqk, p.scale, st.s, next);
  if (ksc) scale_scores(st.s, m, ksc);
  for (std::int64_t i = 0; i < sp.q_len; ++i) {
    const detail::KeyRange vis = p.keys(b, i);
    const std::int64_t lo = std::clamp<std::int64_t>(vis.begin - j0, 0, n);
    const std::int64_t hi = std::clamp<std::int64_t>(vis.end - j0, lo, n);
    for (std::int64_t r = i * g; r < (i + 1) * g; ++r) {
      float* sr = st.s + r * kBlockN;
      if (plain) {
        for (std::int64_t c = 0; c < lo; ++c) sr[c] = kNegInf;
        for (std::int64_t c = hi; c < kBlockN; ++c) sr[c] = kNegInf;
      } else {
        finish_row<E>(p, b, hk * g + r % g, i, j0, lo, hi, sr);
      }
      // Online softmax. A row with nothing visible yet keeps max = -inf and
      // gets P = 0: it subtracts max(max, -FLT_MAX), and exp(-inf) is exactly
      // 0 in every Simd::exp. (A max that dropped a NaN logit still leaves
      // exp(NaN) = NaN in the sum.)
      V mx = Simd::load(sr);
      for (std::int64_t c = W; c < kBlockN; c += W) mx = Simd::max(mx, Simd::load(sr + c));
      const float new_max = std::max(st.row_max[r], Simd::reduce_max(mx));
      const V shift = Simd::set1(std::max(new_max, std::numeric_limits<float>::lowest()));
      V sum = Simd::zero();
      for (std::int64_t c = 0; c < kBlockN; c += W) {
        const V e = Simd::exp(Simd::sub(Simd::load(sr + c), shift));
        Simd::store(sr + c, e);
        sum = Simd::add(sum, e);
      }
      if (new_max != st.row_max[r]) {
        const float alpha = std::exp(st.row_max[r] - new_max);
        float* a = st.acc + r * lda;
        const V av = Simd::set1(alpha);
        for (std::int64_t d = 0; d < lda; d += W) Simd::store(a + d, Simd::mul(Simd::load(a + d), av));
        st.row_sum[r] *= alpha;
        st.scale2[r] *= alpha;
        st.row_max[r] = new_max;
      }
      st.row_sum[r] += Simd::reduce_add(sum);
      // Dropout acts on P after the sums: the LSE and the normalisation are pre-dropout.
      if (p.dropout) {
        const std::int64_t h = hk * g + r % g;
        for (std::int64_t c = lo; c < hi; ++c) {
          // NaN * 0 stays NaN; drawn at global positions (q_offset + i, kv_offset + j).
          sr[c] *= p.dropout_mask.keep(b, h, i + p.mask.q_offset, j0 + c + p.mask.kv_offset) ? p.dropout_scale : 0.0f;
        }
      }
      // V's scales weigh the code rows after the sums (they scale V, not P).
      if (vsc) {
        for (std::int64_t c = 0; c < kBlockN; c += W)
          Simd::store(sr + c, Simd::mul(Simd::load(sr + c), Simd::load(vsc + c)));
      }
    }
  }
  // A row that sees only part of the block takes its keys alone: a zero weight
  // times a NaN or infinite v of a masked key would poison it (0 * NaN = NaN).
  const auto partial = [&](std::int64_t r) {
    const detail::KeyRange vis = p.keys(b, r / g);
    return vis.begin > j0 || vis.end < j0 + n;
  };
  const auto full = [&](std::int64_t r0, std::int64_t count) {
    if (r0 + count > m) return false;
    for (std::int64_t r = r0; r < r0 + count; ++r) {
      if (partial(r)) return false;
    }
    return true;
  };
  // Row r's P V over the keys it sees, for a row that sees part of the block;
  // false where it sees none of them.
  const auto partial_pv = [&](std::int64_t r, const auto& ask) {
    const detail::KeyRange vis = p.keys(b, r / g);
    const std::int64_t lo = std::clamp<std::int64_t>(vis.begin - j0, 0, n);
    const std::int64_t hi = std::clamp<std::int64_t>(vis.end - j0, lo, n);
    if (hi == lo) return false;
    pv_rows<1>(st.s + r * kBlockN + lo, vr + lo, hi - lo, p.dv, st.acc + r * lda, lda, ask);
    return true;
  };
  // Rows go four at a time where they can, so each V row is read once per
  // four query rows and applied to all of them from registers. The first
  // call asks for the next block's V rows.
  std::int64_t r = 0;
#if defined(ATTEND_DECODE_BF16_DOT)
  if (vpairs) {
    // Rows that see the whole block take the pairs; a partial row its keys
    // alone in f32 (a pair's masked key would meet a zero P in vdpbf16ps).
    const std::int64_t npairs = (n + 1) / 2;
    const auto pp = [&](std::int64_t r0, std::int64_t count) {
      for (std::int64_t i = r0; i < r0 + count; ++i) pairs_of_row(st.s + i * kBlockN);
      return reinterpret_cast<const std::uint32_t*>(st.s + r0 * kBlockN);
    };
    while (r < m) {
      if (full(r, 4)) {
        pv_pairs<4>(pp(r, 4), vpairs, npairs, lda, st.acc + r * lda, lda);
        r += 4;
      } else if (full(r, 2)) {
        pv_pairs<2>(pp(r, 2), vpairs, npairs, lda, st.acc + r * lda, lda);
        r += 2;
      } else if (full(r, 1)) {
        pv_pairs<1>(pp(r, 1), vpairs, npairs, lda, st.acc + r * lda, lda);
        ++r;
      } else {
        partial_pv(r++, NextBlock<VV>{});
      }
    }
    return;
  }
#endif
  while (r < m) {
    if (full(r, 4)) {
      pv_rows<4>(st.s + r * kBlockN, vr, n, p.dv, st.acc + r * lda, lda, next);
      r += 4;
    } else if (full(r, 2)) {
      pv_rows<2>(st.s + r * kBlockN, vr, n, p.dv, st.acc + r * lda, lda, next);
      r += 2;
    } else if (!partial_pv(r++, next)) {
      continue;  // the next row still asks for the next block's V rows
    }
    next.n = 0;
  }
  prefetch_rows(next.v, next.n, p.dv);  // no row took a P V step
}

// A split's output is summed in two levels (issue 36, row 8): pv_panel adds
// each key's P v to the level-1 accumulator one after the other, which every
// K blocks is folded into level 2 and emptied. In one f32 accumulator the
// rounding errors of N keys grow as N (0.26 relative at 2^31 identical keys
// in one split); in two levels as K * kBlockN + blocks / K, least at K =
// sqrt(blocks / kBlockN). The floor keeps splits of up to 256 keys on one
// level (no fold, results as before).
inline std::int64_t fold_blocks(std::int64_t blocks) {
  constexpr std::int64_t kFloor = 16;
  if (blocks < kFloor * kFloor * kBlockN) return kFloor;  // also an empty range (blocks <= 0)
  return static_cast<std::int64_t>(std::sqrt(static_cast<double>(blocks) / static_cast<double>(kBlockN)));
}

// dst = acc2 * scale2 + acc, row by row, and likewise for the row sums.
inline void fold_rows(const HeadState& st, std::int64_t m, std::int64_t lda, float* dst, float* dst_sum) {
  for (std::int64_t r = 0; r < m; ++r) {
    const V a = Simd::set1(st.scale2[r]);
    const float *hi = st.acc2 + r * lda, *lo = st.acc + r * lda;
    for (std::int64_t d = 0; d < lda; d += W)
      Simd::store(dst + r * lda + d, Simd::fmadd(Simd::load(hi + d), a, Simd::load(lo + d)));
    dst_sum[r] = std::fma(st.sum2[r], st.scale2[r], st.row_sum[r]);
  }
}

// One split of sequence b for kv heads [hk0, hk1): the heads advance through
// the split's key blocks together, so each block's token rows (all heads side
// by side in memory) are streamed once, and the next block is prefetched.
template <class E, class KV = E>
void split_task(const DecodeParams& p, std::int64_t b, std::int64_t hk0, std::int64_t hk1, std::int64_t split,
                float* scratch) {
  const detail::SeqSpan sp = p.span(b);
  const std::int64_t g = p.group, m = g * sp.q_len, dqk = p.dqk;
  const std::int64_t ldq = p.plan.dqkp, lda = p.plan.dvp;
  if (m == 0) return;
  for (std::int64_t hk = hk0; hk < hk1; ++hk) {
    const HeadState st = carve(p, scratch + (hk - hk0) * p.plan.head_floats);
    for (std::int64_t r = 0; r < m; ++r) {
      const std::int64_t i = r / g, h = hk * g + r % g;
      const E* src = static_cast<const E*>(p.q) + p.sq.offset(b, sp.q_begin + i, h);
      if constexpr (pair_scores<E, KV>) {                // q as given, bf16
        E* dst = reinterpret_cast<E*>(st.qs + r * ldq);  // 2 * ldq elements
        std::copy(src, src + dqk, dst);
        std::fill(dst + dqk, dst + 2 * ldq, detail::from_f32<E>(0.0f));
      } else {
        for (std::int64_t d = 0; d < dqk; ++d) st.qs[r * ldq + d] = to_f32(src[d]) * p.scale;
        std::fill(st.qs + r * ldq + dqk, st.qs + (r + 1) * ldq, 0.0f);
      }
      std::fill(st.acc + r * lda, st.acc + (r + 1) * lda, 0.0f);
      std::fill(st.acc2 + r * lda, st.acc2 + (r + 1) * lda, 0.0f);
      std::fill(st.s + r * kBlockN, st.s + (r + 1) * kBlockN, 0.0f);
      st.row_max[r] = kNegInf;
      st.row_sum[r] = 0.0f;
      st.sum2[r] = 0.0f;
      st.scale2[r] = 1.0f;
    }
  }

  const detail::KeyRange all = p.key_union(b);
  const std::int64_t c0 = all.begin + split * p.plan.split_len;
  const std::int64_t c1 = std::min(all.end, c0 + p.plan.split_len);
  const KV* kr[kBlockN];
  const KV* vr[kBlockN];
  const KV* nk[kBlockN];
  const KV* nv[kBlockN];
  // Per-key scales of an 8-bit cache (padding 1: those columns are masked).
  const bool scaled = p.kscale.data != nullptr;
  alignas(64) float ksc[kBlockN], vsc[kBlockN];
  // Where P V takes vdpbf16ps, each block's V as key pairs (kBlockN / 2 rows
  // of dvp u32: within the kBlockN x dvp floats of the convert region).
  constexpr bool pairs = pair_scores<E, KV>;
  auto* vpairs = reinterpret_cast<std::uint32_t*>(scratch + p.plan.convert_offset);
  const std::int64_t fold_every = fold_blocks((c1 - c0 + kBlockN - 1) / kBlockN);
  std::int64_t since_fold = 0;
  bool folded = false;
  for (std::int64_t j0 = c0; j0 < c1; j0 += kBlockN) {
    if (since_fold == fold_every) {  // only ever with blocks left: the last fold is after the loop
      for (std::int64_t hk = hk0; hk < hk1; ++hk) {
        const HeadState st = carve(p, scratch + (hk - hk0) * p.plan.head_floats);
        fold_rows(st, m, lda, st.acc2, st.sum2);
        std::fill(st.acc, st.acc + m * lda, 0.0f);
        std::fill(st.row_sum, st.row_sum + m, 0.0f);
        std::fill(st.scale2, st.scale2 + m, 1.0f);
      }
      folded = true;
      since_fold = 0;
    }
    ++since_fold;
    const std::int64_t n = std::min(kBlockN, c1 - j0), nn = std::min(kBlockN, c1 - j0 - kBlockN);
    for (std::int64_t hk = hk0; hk < hk1; ++hk) {
      if (nn > 0) p.gather(b, hk, j0 + kBlockN, nn, nk, nv);
      p.gather(b, hk, j0, n, kr, vr);
      std::fill(kr + n, kr + kBlockN, kr[0]);  // whole-block score tiles; masked columns
      if (scaled) {
        p.gather_scales(b, hk, j0, n, ksc, vsc);
        std::fill(ksc + n, ksc + kBlockN, 1.0f);
        std::fill(vsc + n, vsc + kBlockN, 1.0f);
      }
      const HeadState st = carve(p, scratch + (hk - hk0) * p.plan.head_floats);
      if constexpr (sizeof(KV) == 1) {
        // An 8-bit block is widened once into rows of C (L1-resident, kBlockN x
        // (dqkp + dvp)) that all of the group's query rows then read as a
        // bf16/f32 cache's: widening inside the tiles repeats it for each
        // tile of 4, 2 or 1 rows. The next block's code rows are asked for here.
        using C = Converted<E, KV>;
        float* vc = scratch + p.plan.convert_offset;
        C* kc = reinterpret_cast<C*>(vc + kBlockN * p.plan.dvp);
        const C* ck[kBlockN];
        const float* cv[kBlockN];
        for (std::int64_t j = 0; j < n; ++j) {
          if (j < nn) {  // a row at a time (NextBlock's reason)
            prefetch_rows(nk + j, 1, dqk);
            if (!pairs) prefetch_rows(nv + j, 1, p.dv);
          }
          widen_row(kr[j], dqk, kc + j * p.plan.dqkp);
          if (!pairs) widen_row(vr[j], p.dv, vc + j * p.plan.dvp);
          ck[j] = kc + j * p.plan.dqkp;
          if (!pairs) cv[j] = vc + j * p.plan.dvp;
        }
        std::fill(ck + n, ck + kBlockN, ck[0]);
        if constexpr (pairs) {
          pair_block(vr, n, p.dv, p.plan.dvp, vpairs, nv, nn);
          block_step<E>(p, b, hk, j0, n, ck, vr, st, NextBlock<C, KV>{}, scaled ? ksc : nullptr, scaled ? vsc : nullptr,
                        vpairs);
        } else {
          block_step<E>(p, b, hk, j0, n, ck, cv, st, NextBlock<C, float>{}, scaled ? ksc : nullptr,
                        scaled ? vsc : nullptr, nullptr);
        }
      } else {
        const NextBlock<KV> next{nk, nv, std::max<std::int64_t>(nn, 0)};
        if constexpr (pairs) pair_block(vr, n, p.dv, p.plan.dvp, vpairs, nv, next.n);
        block_step<E>(p, b, hk, j0, n, kr, vr, st, next, scaled ? ksc : nullptr, scaled ? vsc : nullptr,
                      pairs ? vpairs : nullptr);
      }
    }
  }

  const bool direct = p.splits(b) == 1;
  for (std::int64_t hk = hk0; hk < hk1; ++hk) {
    const HeadState st = carve(p, scratch + (hk - hk0) * p.plan.head_floats);
    const RowSink<E> sink{p, b, hk, split, direct};
    if (folded) fold_rows(st, m, lda, st.acc, st.row_sum);
    for (std::int64_t r = 0; r < m; ++r) sink.write(r, st.acc + r * lda, st.row_max[r], st.row_sum[r]);
  }
}

inline constexpr std::int64_t kCombineChunk = 256;  // a multiple of every W

// Combines the splits of (sequence b, kv head hk) exactly through their LSEs:
// lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s. Empty splits
// (lse_s = -inf) weigh 0; a row empty in every split stays O = 0, LSE = -inf
// (LSE = z with a sink, whose part adds to lse and nothing to O).
template <class E>
void combine_task(const DecodeParams& p, std::int64_t b, std::int64_t hk) {
  const detail::SeqSpan sp = p.span(b);
  const std::int64_t ns = p.splits(b), g = p.group, dv = p.dv;
  for (std::int64_t r = 0; r < g * sp.q_len; ++r) {
    const std::int64_t i = r / g, h = hk * g + r % g, row = sp.q_begin + i;
    const auto lse_of = [&](std::int64_t s) { return p.partial_lse(b, hk, s)[r]; };
    // The sink is one more part, with LSE z and O = 0 (docs/semantics.md's merge rule).
    const float z = p.sinks(h);
    const auto part_lse = [&](std::int64_t s) { return s < ns ? lse_of(s) : z; };
    const float lse = detail::merged_lse<float>(p.sinks.any() ? ns + 1 : ns, part_lse);  // attend::merge's formula
    E* dst = static_cast<E*>(p.out) + p.so.offset(b, row, h);
    if (lse == kNegInf) {
      std::fill(dst, dst + dv, detail::from_f32<E>(0.0f));
      p.lse[p.slse.offset(b, row, h)] = kNegInf;
      continue;
    }
    // Weighted sum in f32, split by split in a fixed order, one output chunk
    // at a time; converted to E once per element.
    float acc[kCombineChunk];
    for (std::int64_t d0 = 0; d0 < dv; d0 += kCombineChunk) {
      const std::int64_t nd = std::min(kCombineChunk, dv - d0);
      std::fill(acc, acc + nd, 0.0f);
      for (std::int64_t s = 0; s < ns; ++s) {
        const float w = detail::merge_weight(lse_of(s), lse);
        if (w == 0.0f) continue;
        const float* src = p.partial_out(b, hk, s) + r * p.plan.dvp + d0;
        std::int64_t d = 0;
        const V wv = Simd::set1(w);
        for (; d + W <= nd; d += W) Simd::store(acc + d, Simd::fmadd(wv, Simd::load(src + d), Simd::load(acc + d)));
        for (; d < nd; ++d) acc[d] += w * src[d];
      }
      detail::store_row<Simd>(dst + d0, acc, nd);
    }
    p.lse[p.slse.offset(b, row, h)] = lse;
  }
}

// The kernels of q/out type E over K/V of type KV.
template <class E, class KV = E>
constexpr DtypeKernels kernels_of() {
  return {&split_task<E, KV>, &combine_task<E>};
}

// Every (E, KV) pair decode runs in this family.
inline KernelTable make_table(std::string_view isa) {
  using detail::bf16_t;
  using detail::f16_t;
  KernelTable t{isa, kernels_of<float>(), kernels_of<bf16_t>(), kernels_of<f16_t>(), {}};
  const auto row = [&]<class E>(E*, std::array<DtypeKernels, 3>& q8) {
    q8 = {kernels_of<E, detail::fp8_e4m3_t>(), kernels_of<E, detail::fp8_e5m2_t>(), kernels_of<E, std::int8_t>()};
  };
  row(static_cast<float*>(nullptr), t.q8[0]);
  row(static_cast<bf16_t*>(nullptr), t.q8[1]);
  row(static_cast<f16_t*>(nullptr), t.q8[2]);
  return t;
}

}  // namespace attend::decode::ATTEND_DECODE_ISA
