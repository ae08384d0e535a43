// The bf16 forward's online softmax, fused with the rounding of P to bf16 key
// pairs (the PV GEMM's operand). At bf16 GEMM rates (vdpbf16ps, and AMX far
// more) the work between the two GEMMs costs as much as the GEMMs, so it is cut
// to what each score needs (FlashAttention-3/4's recipe):
// - the scale is folded into the exponent: scores stay as the QK^T GEMM left
//   them and exp2((s - max) * scale * log2 e) replaces a scaling pass over the
//   tile and exp's own multiply by log2 e;
// - exp2 is a degree-5 minimax polynomial (relative error 1.5e-7, as accurate
//   as the Taylor degree 6 of S::exp) without the overflow clamp, which the
//   exponent, at most kLazyGrowth, never needs;
// - P goes from registers straight to bf16 pairs: no f32 P is stored and read
//   back, unless dropout or a non-finite V (nonfinite_tile.h) needs it;
// - the running max is lazy (FlashAttention-4): a query's reference max moves
//   only when a block's max exceeds it by more than 2^kLazyGrowth, so most
//   blocks after the first leave the output accumulator as it is, and P may
//   reach 2^kLazyGrowth (exact in f32 and bf16, whose range is f32's). The LSE
//   is reference + log(sum) whatever the reference, so results differ from an
//   eager max by rounding only.
// Included inside the avx512bf16 target region of isa_avx512.cpp.
#pragma once

#include <cstdint>
#include <limits>

namespace attend::flash::ATTEND_FLASH_ISA {

// Growth of a block's max over the reference, in log2 units, that moves it.
inline constexpr float kLazyGrowth = 8.0f;

// Near-minimax degree-5 fit of 2^f on [-0.5, 0.5] (Lawson-weighted least
// squares on Chebyshev nodes, coefficients rounded to f32 and re-checked):
// max relative error 1.55e-7 over the interval.
inline constexpr float kExp2Minimax5[6] = {1.00000012f,   0.693146944f,   0.240221202f,
                                           0.0555071309f, 0.00967554189f, 0.00132764725f};

// 2^t for t <= kLazyGrowth (+ rounding), 0 below 2^-126 (as S::exp: no
// subnormal P), NaN for NaN. -inf gives 0: the lower clamp keeps
// roundscale from turning it into inf - inf.
inline __m512 exp2_bounded(__m512 t) {
  const __m512 tc = _mm512_max_ps(_mm512_set1_ps(-126.0f), t);
  const __m512 n = _mm512_roundscale_ps(tc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(tc, n);
  __m512 p = _mm512_set1_ps(kExp2Minimax5[5]);
  for (int i = 4; i >= 0; --i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Minimax5[i]));
  return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ), p, n);
}

// One online-softmax step over a key-major tile of n key rows (ld floats
// apart), for the query columns [c0, c1) (multiples of 16):
// - row_max holds each query's reference max in the tile's units, row_sum its
//   running sum of exp; `to_log2` turns a difference of scores into log2
//   units (scale * log2 e for raw QK^T scores, log2 e for final logits);
// - pairs[pp * ldp + c] receives (P[2pp][c], P[2pp+1][c]) rounded to bf16
//   (zero past the n-th key); keep_p, when not null, receives the f32 P in
//   st's layout (dropout and visible_pv read it);
// - alpha[c] the factor the output accumulator's column c must be scaled by,
//   1 where the reference stayed (and for a query that had seen nothing yet:
//   its accumulator is 0).
// - an 8-bit K/V's scales (kScaled): key j's scores are st's row j times
//   key_mul[j] (the softmax scale times K's scale, in the units of row_max),
//   and its P enters the pairs times p_mul[j] (V's scale) while the row sums
//   and keep_p take P as it is — fused here, so that neither is a pass over
//   the tile of its own.
// Returns whether any alpha differs from 1. As online_softmax_step, a query
// with nothing visible keeps max -inf and the floor keeps its P at 0, not NaN;
// the row sums use the unrounded P.
template <bool kScaled = false>
inline bool softmax_to_pairs(const float* st, std::int64_t ld, std::int64_t n, std::int64_t c0, std::int64_t c1,
                             float to_log2, float* row_max, float* row_sum, float* alpha, std::uint32_t* pairs,
                             std::int64_t ldp, float* keep_p, const float* key_mul = nullptr,
                             const float* p_mul = nullptr) {
  const __m512 floor = _mm512_set1_ps(std::numeric_limits<float>::lowest());
  const __m512 growth = _mm512_set1_ps(kLazyGrowth / to_log2), k = _mm512_set1_ps(to_log2);
  const __m512 one = _mm512_set1_ps(1.0f), neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const std::int64_t np = (n + 1) / 2;
  const auto score = [&](const float* row, std::int64_t j, std::int64_t c) {
    const __m512 x = _mm512_loadu_ps(row + c);
    if constexpr (kScaled) {
      // Rounded on its own, never contracted into the exponent's subtraction
      // (-ffp-contract=fast may fuse mul and sub into one FMA): the block's max
      // is taken of this rounded product, and an FMA would leave its rounding
      // error in score - max — up to 64 at logits of 1e9, 2^92 after exp2.
      return _mm512_mul_round_ps(x, _mm512_set1_ps(key_mul[j]), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else {
      return x;
    }
  };
  __mmask16 rescale = 0;
  for (std::int64_t c = c0; c < c1; c += 16) {
    const __m512 old_max = _mm512_loadu_ps(row_max + c);
    __m512 block_max = old_max;
    for (std::int64_t j = 0; j < n; ++j) block_max = _mm512_max_ps(block_max, score(st + j * ld, j, c));
    // Moves where the block's max passes the reference by more than the
    // growth (always from -inf; never for a NaN, which reaches the sum anyway).
    const __mmask16 moved = _mm512_cmp_ps_mask(block_max, _mm512_add_ps(old_max, growth), _CMP_GT_OQ);
    const __m512 new_max = _mm512_mask_mov_ps(old_max, moved, block_max);
    const __m512 shift = _mm512_max_ps(new_max, floor);
    const __mmask16 scaled = moved & _mm512_cmp_ps_mask(old_max, neg_inf, _CMP_NEQ_UQ);
    const __m512 a = _mm512_mask_mov_ps(one, scaled, exp2_bounded(_mm512_mul_ps(_mm512_sub_ps(old_max, shift), k)));
    rescale |= scaled;
    __m512 sum = _mm512_setzero_ps();
    for (std::int64_t pp = 0; pp < np; ++pp) {
      const float* lo = st + 2 * pp * ld;
      const __m512 e0 = exp2_bounded(_mm512_mul_ps(_mm512_sub_ps(score(lo, 2 * pp, c), shift), k));
      sum = _mm512_add_ps(sum, e0);
      __m512 e1 = _mm512_setzero_ps();
      if (2 * pp + 1 < n) {
        e1 = exp2_bounded(_mm512_mul_ps(_mm512_sub_ps(score(lo + ld, 2 * pp + 1, c), shift), k));
        sum = _mm512_add_ps(sum, e1);
      }
      if constexpr (kScaled) {
        const __m512 w1 = 2 * pp + 1 < n ? _mm512_set1_ps(p_mul[2 * pp + 1]) : _mm512_setzero_ps();
        _mm512_storeu_si512(pairs + pp * ldp + c,
                            pack_pairs(_mm512_mul_ps(e0, _mm512_set1_ps(p_mul[2 * pp])), _mm512_mul_ps(e1, w1)));
      } else {
        _mm512_storeu_si512(pairs + pp * ldp + c, pack_pairs(e0, e1));
      }
      if (keep_p != nullptr) {
        _mm512_storeu_ps(keep_p + 2 * pp * ld + c, e0);
        if (2 * pp + 1 < n) _mm512_storeu_ps(keep_p + (2 * pp + 1) * ld + c, e1);
      }
    }
    _mm512_storeu_ps(alpha + c, a);
    _mm512_storeu_ps(row_max + c, new_max);
    _mm512_storeu_ps(row_sum + c, _mm512_fmadd_ps(_mm512_loadu_ps(row_sum + c), a, sum));
  }
  return rescale != 0;
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
