// The bf16 forward of the avx512amx and avx512bf16 kernel families:
// forward_impl.h's algorithm (S^T = K Q^T per key block, online softmax across
// key rows, O += P V) with both GEMMs on bf16 hardware:
//   Tiles = cpu::AmxTiles (avx512amx) or cpu::AmxTilesEmulated (its exact
//     emulation, cpu/amx_tiles.h): AMX-BF16 tiles (gemm_amx.h), 16 x 16 x 32
//     multiply-adds per instruction; the output is accumulated transposed
//     (O^T = V^T P^T) so that P^T's pair layout is the tile B operand as it is,
//     and V^T is built 16 x 16 words at a time by register transposes;
//   Tiles = void (avx512bf16): vdpbf16ps (gemm_bf16.h), 2 x an f32 FMA's
//     multiply-adds per instruction.
// Operands are packed as bf16 pairs of consecutive depth indices: Q^T and K
// exactly as given (unscaled: the scale multiplies the f32 scores), V by pairs
// of keys, and P — rounded to bf16, as FlashAttention does on GPUs — by pairs
// of keys as well. Scores, softmax statistics, the output accumulator and the
// LSE stay f32; the row sums use the unrounded P.
// An 8-bit K/V (KV = fp8_e4m3_t, fp8_e5m2_t, int8_t) is packed from its codes,
// each exact in bf16, and its scales act on the f32 tiles: K's multiplies the
// key's row of S^T (with the softmax scale), V's the key's row of P^T before P
// is rounded to pairs (the row sums keep the unscaled P).
// Included inside the avx512bf16 + AMX target region of isa_avx512.cpp, after
// forward_impl.h (it shares its logit and softmax helpers).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"
#include "backends/flash/softmax_pairs.h"

namespace attend::flash::ATTEND_FLASH_ISA {

// Pairs along the head dimension (AMX: padded to its 16-pair tile depth).
template <bool kAmx>
constexpr std::int64_t head_pairs(std::int64_t dqk) {
  return kAmx ? round_up((dqk + 1) / 2, 16) : (dqk + 1) / 2;
}

// Words of one packed block of BN keys: K as BN rows of head-dim pairs; V as
// BN / 2 rows of key pairs (vdpbf16ps) or, for AMX, their transpose (dvp rows
// of BN / 2 key pairs, the tile A operand of O^T = V^T P^T); then one word
// saying whether V's rows are all finite (nonfinite_tile.h), padded to a
// cache line. K/V are packed once per (batch, kv head) for all its tasks
// (FlashParams::packed_kv) or, without that buffer, per task into scratch.
template <class S, class Tiles>
std::int64_t packed_block_words(std::int64_t dqk, std::int64_t dv) {
  using Tr = KernelTraits<S>;
  static_assert(Tr::fwd_n % 16 == 0, "whole cache lines per block (flash_backend.cpp's buffer relies on it)");
  return Tr::fwd_n * head_pairs<!std::is_void_v<Tiles>>(dqk) + Tr::fwd_n / 2 * round_up(dv, S::W) + 16;
}

// Floats of the bf16 forward's scratch, laid out in forward_block_bf16_gemm
// (an 8-bit K/V adds a block of V's codes as bf16 rows, dvp apart), beyond
// what forward_scratch_floats already gives.
template <class S, class Tiles, bool kQuant>
std::int64_t forward_bf16_extra_floats(std::int64_t dqk, std::int64_t dv) {
  using Tr = KernelTraits<S>;
  constexpr std::int64_t BM = Tr::fwd_m, BN = Tr::fwd_n;
  const std::int64_t dvp = round_up(dv, S::W);
  const std::int64_t need = head_pairs<!std::is_void_v<Tiles>>(dqk) * BM  // Q^T pairs
                            + packed_block_words<S, Tiles>(dqk, dv)       // a block packed here
                            + BN / 2 * dvp                                // V's pairs before AMX's transpose
                            + BN * BM + BN / 2 * BM                       // S^T / P^T, P^T pairs
                            + 2 * (BM * dvp + 3 * BM)                     // both levels' O and statistics
                            + (kQuant ? BN * dvp / 2 : 0)                 // an 8-bit V's rows as bf16
                            + (kQuant ? 2 * BN : 0)                       // and its per-key factors
                            + 64;
  return std::max<std::int64_t>(0, need - forward_scratch_floats<S>(dqk, dv));
}

// dst[pp * ldd + r] = (src[r][2pp], src[r][2pp + 1]) as one word, for pp < kp
// and r < rows_pad (a multiple of 16); rows from `rows` on, the odd head dim's
// missing half and pairs past `cols` are zeros. 16 rows x 16 pairs at a time:
// masked row loads (nothing read past a row) and transpose16x16 (gemm_amx.h).
// The next 16 rows are asked for first: rows sit H*D elements apart, and the
// scalar copy this replaces stalled on each row's first line (~18 % of a
// causal S = 512, D = 64 forward).
inline void pack_pairs_transposed(const detail::bf16_t* src, std::int64_t ld, std::int64_t rows, std::int64_t rows_pad,
                                  std::int64_t cols, std::int64_t kp, std::uint32_t* dst, std::int64_t ldd) {
  for (std::int64_t r0 = 0; r0 < rows_pad; r0 += 16) {
    const std::int64_t nr = std::clamp<std::int64_t>(rows - r0, 0, 16);
    for (std::int64_t i = 16; i < std::min<std::int64_t>(32, rows - r0); ++i) prefetch_row(src + (r0 + i) * ld, cols);
    for (std::int64_t p0 = 0; p0 < kp; p0 += 16) {
      const std::int64_t left = std::clamp<std::int64_t>(cols - 2 * p0, 0, 32);
      const auto mask = static_cast<__mmask32>(left == 32 ? ~0u : (1u << left) - 1u);
      __m512i w[16];
      for (std::int64_t i = 0; i < 16; ++i) {
        w[i] = i < nr ? _mm512_maskz_loadu_epi16(mask, src + (r0 + i) * ld + 2 * p0) : _mm512_setzero_si512();
      }
      transpose16x16(w);
      for (std::int64_t i = 0; i < std::min<std::int64_t>(16, kp - p0); ++i) {
        _mm512_storeu_si512(dst + (p0 + i) * ldd + r0, w[i]);
      }
    }
  }
}

// n codes as bf16 (exact: every 8-bit code is a bf16), 16 at a time through
// the family's widening loads; a partial vector goes through a zero-padded copy
// so that nothing past the row is read.
template <class S, class KV>
inline void codes_to_bf16(const KV* src, std::int64_t n, detail::bf16_t* dst) {
  std::int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), (__m256i)_mm512_cvtneps_pbh(detail::load_f32<S>(src + d)));
  }
  if (d < n) {
    KV edge[16] = {};
    std::copy(src + d, src + n, edge);
    alignas(32) detail::bf16_t out[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), (__m256i)_mm512_cvtneps_pbh(detail::load_f32<S>(edge)));
    std::copy(out, out + (n - d), dst + d);
  }
}

// Packs keys [j0, j0 + n) (n <= BN) of (batch b, kv head hk) into one block
// at dst (packed_block_words' layout). vv is scratch for V's pairs before
// AMX's transpose, vcodes for an 8-bit V's rows widened to bf16. Rows past n
// that a GEMM reads (AMX: up to 32 keys, 16 pairs) are zeros.
template <class S, class Tiles, class KV>
void pack_kv_block(const FlashParams& p, std::int64_t b, std::int64_t hk, const detail::SeqSpan& span, std::int64_t j0,
                   std::int64_t n, std::uint32_t* dst, std::uint32_t* vv, detail::bf16_t* vcodes) {
  constexpr bool kAmx = !std::is_void_v<Tiles>;
  constexpr bool kQuant = !std::is_same_v<KV, detail::bf16_t>;
  constexpr std::int64_t BN = KernelTraits<S>::fwd_n;
  using detail::bf16_t;
  const std::int64_t dqk = p.dqk, dv = p.dv, dvp = round_up(dv, S::W), kp = head_pairs<kAmx>(dqk);
  const std::int64_t np = (n + 1) / 2;
  const __mmask16 dv_tail = static_cast<__mmask16>((1u << (dv % 16)) - 1u);
  for (std::int64_t j = 0; j < n; ++j) {
    std::uint32_t* row = dst + j * kp;
    std::fill(row + dqk / 2, row + kp, 0u);  // the odd head dim's missing half, AMX padding
    if constexpr (kQuant) {
      codes_to_bf16<S>(p.k_row<KV>(b, span, j0 + j, hk), dqk, reinterpret_cast<bf16_t*>(row));
      codes_to_bf16<S>(p.v_row<KV>(b, span, j0 + j, hk), dv, vcodes + j * dvp);
    } else {
      std::memcpy(row, p.k_row<bf16_t>(b, span, j0 + j, hk), static_cast<std::size_t>(dqk) * sizeof(bf16_t));
    }
  }
  if constexpr (kAmx) std::fill(dst + n * kp, dst + round_up(n, 32) * kp, 0u);
  const auto v_bf16 = [&](std::int64_t j) -> const bf16_t* {
    if constexpr (kQuant) {
      return vcodes + j * dvp;
    } else {
      return p.v_row<bf16_t>(b, span, j0 + j, hk);
    }
  };
  std::uint32_t* vout = dst + BN * kp;
  std::uint32_t* pairs = kAmx ? vv : vout;  // (v[2pp][d], v[2pp + 1][d]), dvp words a row
  for (std::int64_t pp = 0; pp < np; ++pp) {
    const bf16_t* v0 = v_bf16(2 * pp);
    const bf16_t* v1 = 2 * pp + 1 < n ? v_bf16(2 * pp + 1) : nullptr;
    for (std::int64_t d = 0; d < dvp; d += 16) {
      const __mmask16 mask = d + 16 <= dv ? static_cast<__mmask16>(0xffff) : dv_tail;
      const __m256i a = _mm256_maskz_loadu_epi16(mask, v0 + d);
      const __m256i c = v1 ? _mm256_maskz_loadu_epi16(mask, v1 + d) : _mm256_setzero_si256();
      _mm512_storeu_si512(pairs + pp * dvp + d, interleave_rows(a, c));
    }
  }
  if constexpr (kAmx) {
    // V^T as pairs of keys: vt[d][pp] = (v[2pp][d], v[2pp+1][d]), built 16 x 16
    // words at a time from the pairs' rows and transposed in registers.
    for (std::int64_t p0 = 0; p0 < round_up(np, 16); p0 += 16) {
      for (std::int64_t d0 = 0; d0 < dvp; d0 += 16) {
        __m512i w[16];
        for (int i = 0; i < 16; ++i) {
          w[i] = p0 + i < np ? _mm512_loadu_si512(pairs + (p0 + i) * dvp + d0) : _mm512_setzero_si512();
        }
        transpose16x16(w);
        for (int i = 0; i < 16; ++i) _mm512_storeu_si512(vout + (d0 + i) * (BN / 2) + p0, w[i]);
      }
    }
  }
  // A NaN or infinite v would reach masked queries through the GEMM
  // (nonfinite_tile.h): visible_pv then reads the f32 P, as dropout does.
  dst[packed_block_words<S, Tiles>(dqk, dv) - 16] = rows_finite<S, bf16_t>(n, dv, v_bf16) ? 1u : 0u;
}

// Packs the key blocks [kb0, kb1) of (batch b, kv head hk) into the pair's
// buffer (DtypeKernels::pack_kv): block kb holds the keys [kb * BN, kb * BN +
// BN) that the sequence's queries see, up to the last one any of them sees.
template <class S, class Tiles, class KV>
void pack_kv_blocks(const FlashParams& p, std::int64_t b, std::int64_t hk, std::int64_t kb0, std::int64_t kb1,
                    std::uint32_t* dst, float* scratch) {
  constexpr std::int64_t BN = KernelTraits<S>::fwd_n;
  const detail::SeqSpan span = p.span(b);
  if (span.q_len <= 0) return;
  const std::int64_t end = p.keys(span.q_len - 1, span).end;
  const std::int64_t words = packed_block_words<S, Tiles>(p.dqk, p.dv);
  auto* vv = reinterpret_cast<std::uint32_t*>(scratch);
  auto* vcodes = reinterpret_cast<detail::bf16_t*>(vv + BN / 2 * round_up(p.dv, S::W));
  for (std::int64_t kb = kb0; kb < kb1 && kb * BN < end; ++kb) {
    pack_kv_block<S, Tiles, KV>(p, b, hk, span, kb * BN, std::min(BN, end - kb * BN), dst + kb * words, vv, vcodes);
  }
}

template <class S, class Tiles = void, class KV = detail::bf16_t>
void forward_block_bf16_gemm(const FlashParams& p, std::int64_t b, std::int64_t h, std::int64_t qb, float* scratch) {
  constexpr bool kAmx = !std::is_void_v<Tiles>;
  constexpr bool kQuant = !std::is_same_v<KV, detail::bf16_t>;
  static_assert(S::W == 16, "vdpbf16ps kernels are AVX-512 only");
  using Tr = KernelTraits<S>;
  using V = typename S::V;
  using detail::bf16_t;
  constexpr std::int64_t BM = Tr::fwd_m, BN = Tr::fwd_n;
  static_assert(BN % 2 == 0 && BM % 16 == 0);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const detail::SeqSpan span = p.span(b);
  const std::int64_t i0 = qb * BM, m = std::min(BM, span.q_len - i0);
  if (m <= 0) return;
  const std::int64_t mp = round_up(m, S::W), hk = h / p.group, dqk = p.dqk, dv = p.dv, dvp = round_up(dv, S::W);
  const std::int64_t kp = head_pairs<kAmx>(dqk), block_words = packed_block_words<S, Tiles>(dqk, dv);
  if constexpr (kAmx) Tiles::configure();

  auto* qt2 = reinterpret_cast<std::uint32_t*>(scratch);       // kp x BM: (q[r][2p], q[r][2p+1])
  auto* own_block = qt2 + kp * BM;                             // a block packed here (packed_block_words)
  auto* vv2 = own_block + block_words;                         // BN/2 x dvp: V's pairs before AMX's transpose
  float* st = reinterpret_cast<float*>(vv2 + BN / 2 * dvp);    // BN x BM: S^T, then P^T (f32)
  auto* pt2 = reinterpret_cast<std::uint32_t*>(st + BN * BM);  // BN/2 x BM: (P[r][2p], P[r][2p+1])
  float* acc = reinterpret_cast<float*>(pt2 + BN / 2 * BM);    // BM x dvp
  float* row_max = acc + BM * dvp;
  float* row_sum = row_max + BM;
  float* alpha = row_sum + BM;
  // Level 2 of the output and row sums (forward_impl.h, fold_blocks), in acc's layout.
  float* acc2 = alpha + 2 * BM;
  float* sum2 = acc2 + BM * dvp;
  float* scale2 = sum2 + BM;
  // An 8-bit V's block of codes as bf16 rows, dvp apart, which pack_kv_block
  // pairs as it pairs a bf16 V's rows.
  auto* vcodes = reinterpret_cast<bf16_t*>(scale2 + BM);
  // An 8-bit K/V's per-key factors of the block (softmax_to_pairs).
  [[maybe_unused]] float* key_mul = reinterpret_cast<float*>(vcodes + BN * dvp);
  [[maybe_unused]] float* p_mul = key_mul + BN;
  // K/V packed once for every task of this (batch, kv head), or null: each
  // block is packed here. Blocks start at multiples of BN either way, so that
  // both give the same result bit for bit.
  const std::uint32_t* pair_kv = p.packed_pair(b, hk);

  pack_pairs_transposed(p.q_as<bf16_t>() + p.sq.offset(b, span.q_begin + i0, h), p.sq.s, m, mp, dqk, kp, qt2, BM);
  std::fill(row_max, row_max + mp, kNegInf);
  std::fill(row_sum, row_sum + mp, 0.0f);
  // AMX accumulates O^T (dvp x BM: rows are output dims), so that P^T's pair
  // layout is its B operand as it stands; the AVX-512 path O (BM x dvp).
  std::fill(acc, acc + (kAmx ? dvp * BM : m * dvp), 0.0f);

  const detail::KeyRange first = p.keys(i0, span), last = p.keys(i0 + m - 1, span);
  const std::int64_t keys_from = first.begin / BN * BN, seq_keys_end = p.keys(span.q_len - 1, span).end;
  const bool plain = p.softcap == 0 && !p.alibi && !p.bias;
  // The units of the scores and of row_max: raw QK^T when only the mask acts
  // on them and the scale is positive (max commutes with it), else logits.
  // Raw units also need scale * log2 e and the lazy growth in raw units
  // (kLazyGrowth over it) to be normal floats: at scales near 0 or FLT_MAX
  // one of them is 0 or inf, and -inf + inf or 0 * inf would make NaN of
  // the reference max or the exponent; such scales take the logits' path.
  const float raw_to_log2 = p.scale * cpu::kLog2e;
  const bool raw =
      !kQuant && plain && std::isnormal(raw_to_log2) && std::isnormal(kLazyGrowth / raw_to_log2) && p.scale > 0;
  const float to_log2 = raw ? raw_to_log2 : cpu::kLog2e;
  // A block adds to an accumulator element once per key pair (vdpbf16ps), or
  // once per 32 keys (an AMX tile step).
  const std::int64_t fold_every = fold_blocks((last.end - keys_from + BN - 1) / BN, kAmx ? BN / 32 : BN / 2);
  std::int64_t since_fold = 0;
  bool folded = false;
  // dst = hi * scale2 + lo (copy: lo) over the accumulators and row sums.
  const auto fold = [&](float* dst, const float* hi, const float* lo, float* dst_sum, const float* hi_sum,
                        const float* lo_sum, bool copy) {
    if constexpr (kAmx) {  // O^T: the factors run along each row
      for (std::int64_t d = 0; d < dvp; ++d) {
        for (std::int64_t c = 0; c < mp; c += S::W) {
          const V l = S::load(lo + d * BM + c);
          S::store(dst + d * BM + c, copy ? l : S::fmadd(S::load(hi + d * BM + c), S::load(scale2 + c), l));
        }
      }
      for (std::int64_t c = 0; c < mp; c += S::W) {
        const V l = S::load(lo_sum + c);
        S::store(dst_sum + c, copy ? l : S::fmadd(S::load(hi_sum + c), S::load(scale2 + c), l));
      }
    } else {
      fold_level<S>(dst, hi, lo, m, dvp, dvp, dst_sum, hi_sum, lo_sum, scale2, copy);
    }
  };
  for (std::int64_t j0 = keys_from; j0 < last.end; j0 += BN) {
    if (since_fold == fold_every) {  // only ever with blocks left: the last fold is after the loop
      fold(acc2, acc2, acc, sum2, sum2, row_sum, !folded);
      std::fill(acc, acc + (kAmx ? dvp * BM : m * dvp), 0.0f);
      std::fill(row_sum, row_sum + mp, 0.0f);
      std::fill(scale2, scale2 + mp, 1.0f);
      folded = true;
      since_fold = 0;
    }
    ++since_fold;
    const std::int64_t n = std::min(BN, last.end - j0), np = (n + 1) / 2;
    const std::uint32_t* blk = own_block;
    if (pair_kv != nullptr && j0 / BN < p.packed_blocks) {
      blk = pair_kv + j0 / BN * block_words;
    } else {
      // The rows pack_kv_blocks would pack (up to the sequence's last visible
      // key, not this task's): V's finiteness flag then covers the same rows.
      pack_kv_block<S, Tiles, KV>(p, b, hk, span, j0, std::min(BN, seq_keys_end - j0), own_block, vv2, vcodes);
      for (std::int64_t j = j0 + BN; j < std::min(j0 + 2 * BN, last.end); ++j) {
        prefetch_row(p.k_row<KV>(b, span, j, hk), dqk);
        prefetch_row(p.v_row<KV>(b, span, j, hk), dv);
      }
    }
    // K's pairs (n rows, kp apart); V's pairs (BN/2 x dvp), for AMX V^T (dvp x BN/2).
    const std::uint32_t *kblk2 = blk, *vpairs = blk + BN * kp;
    const bool v_finite = blk[block_words - 16] != 0;
    // Only the queries that see some key of this block take part, [c0, c1)
    // widened to whole vectors (forward_impl.h); AMX tiles take all of them.
    std::int64_t c0 = 0, c1 = mp;
    if constexpr (!kAmx) {
      // Keys before first.begin (the block starts at a multiple of BN) are seen by none of them.
      const detail::KeyRange seen_lo = p.queries(std::max(j0, first.begin), span);
      const detail::KeyRange seen_hi = p.queries(j0 + n - 1, span);
      c0 = std::max<std::int64_t>(0, seen_lo.begin - i0) / S::W * S::W;
      c1 = std::min(mp, round_up(std::max<std::int64_t>(0, seen_hi.end - i0), S::W));
      if (c1 <= c0) continue;
    }
    const std::int64_t mc = std::min(m, c1) - c0;  // real queries in the range
    const bool interior = p.keys(i0 + c0 + mc - 1, span).begin <= j0 && p.keys(i0 + c0, span).end >= j0 + n;
    if constexpr (kAmx) {
      amx_gemm<Tiles>(round_up(n, 32), mp, kp, kblk2, kp, qt2, BM, st, BM, false);
    } else if (interior) {
      dp_gemm<Tr::mr, Tr::nv>(n, c1 - c0, kp, MatW{kblk2, kp, 1}, qt2 + c0, BM, st + c0, BM, false);
    } else {
      // A diagonal tile, a vector of keys at a time (forward_impl.h).
      for (std::int64_t u = 0; u < n; u += S::W) {
        const std::int64_t cu =
            std::max(c0, std::max<std::int64_t>(0, p.queries(j0 + u, span).begin - i0) / S::W * S::W);
        if (cu >= c1) break;
        dp_gemm<Tr::mr, Tr::nv>(std::min<std::int64_t>(S::W, n - u), c1 - cu, kp, MatW{kblk2 + u * kp, kp, 1}, qt2 + cu,
                                BM, st + u * BM + cu, BM, false);
      }
    }
    // An 8-bit K/V's scales per key: K's times the softmax scale on the
    // scores, V's on P as it is rounded to pairs. The softmax may read the
    // scores times K's factors only where each is a positive normal float:
    // the mask's -inf times 0 (a zero or underflowing scale) or times a
    // negative factor would not stay -inf.
    bool fused = kQuant && plain;
    if constexpr (kQuant) {
      for (std::int64_t j = 0; j < n; ++j) {
        key_mul[j] = p.scale * p.kscale.at(p.pages, b, span.kv_begin + j0 + j, hk);
        p_mul[j] = p.vscale.at(p.pages, b, span.kv_begin + j0 + j, hk);
        fused = fused && std::isnormal(key_mul[j]) && key_mul[j] > 0.0f;
      }
    }
    // Raw scores (no scaling pass) where nothing but the mask acts on them:
    // softmax_to_pairs folds the scale into its exponent, or the scales of an
    // 8-bit K into its reading of the scores (softmax_pairs.h).
    if (!raw && !fused) {
      for (std::int64_t j = 0; j < n; ++j) {
        const V vscale = S::set1(kQuant ? key_mul[j] : p.scale);
        for (std::int64_t c = c0; c < c1; c += S::W)
          S::store(st + j * BM + c, S::mul(S::load(st + j * BM + c), vscale));
      }
      if constexpr (kQuant) std::fill(key_mul, key_mul + n, 1.0f);  // the scores are logits now
    }
    const Tile tile{b, h, i0 + c0, mc, j0, n, span, st + c0, BM, true, n, c1 - c0};
    if (!(plain && interior)) finish_logits<S, bf16_t>(p, tile, nullptr);

    // A NaN or infinite v would reach masked queries through the GEMM
    // (nonfinite_tile.h): visible_pv then reads the f32 P, as dropout does.
    float* keep_p = (p.dropout || !v_finite) ? st : nullptr;
    if (softmax_to_pairs<kQuant>(st, BM, n, c0, c1, to_log2, row_max, row_sum, alpha, pt2, BM, keep_p, key_mul,
                                 p_mul)) {
      if constexpr (kAmx) {
        for (std::int64_t c = 0; c < mp; c += S::W) {
          const V a = S::load(alpha + c);
          if (_mm512_cmp_ps_mask(a, S::set1(1.0f), _CMP_NEQ_UQ) == 0) continue;
          for (std::int64_t d = 0; d < dvp; ++d) S::store(acc + d * BM + c, S::mul(S::load(acc + d * BM + c), a));
          if (folded) S::store(scale2 + c, S::mul(S::load(scale2 + c), a));
        }
      } else {
        for (std::int64_t r = c0; r < c0 + mc; ++r) {
          if (alpha[r] == 1.0f) continue;
          const V a = S::set1(alpha[r]);
          for (std::int64_t d = 0; d < dvp; d += S::W)
            S::store(acc + r * dvp + d, S::mul(S::load(acc + r * dvp + d), a));
          if (folded) scale2[r] *= alpha[r];
        }
      }
    }
    if (p.dropout) {
      // Dropout acts on P after the sums; then P (an 8-bit V's weighed by its
      // scales) is rounded to pairs again — unless visible_pv takes the f32 P
      // (which applies V's scales itself) instead of the pairs.
      apply_dropout(p, tile);
      for (std::int64_t pp = 0; pp < np && v_finite; ++pp) {
        const float* lo = st + 2 * pp * BM;
        const float* hi = 2 * pp + 1 < n ? lo + BM : nullptr;
        const V w0 = S::set1(kQuant ? p_mul[2 * pp] : 1.0f), w1 = S::set1(kQuant && hi ? p_mul[2 * pp + 1] : 1.0f);
        for (std::int64_t c = c0; c < c1; c += S::W) {
          const __m512 h16 = hi ? S::mul(_mm512_loadu_ps(hi + c), w1) : _mm512_setzero_ps();
          _mm512_storeu_si512(pt2 + pp * BM + c, pack_pairs(S::mul(_mm512_loadu_ps(lo + c), w0), h16));
        }
      }
    }
    if (!v_finite) {
      visible_pv<S, KV>(p, b, hk, span, i0, c0, c0 + mc, j0, n, st, BM, acc, kAmx ? 1 : dvp, kAmx ? BM : 1);
    } else if constexpr (kAmx) {
      const std::int64_t npp = round_up(np, 16);
      for (std::int64_t pp = np; pp < npp; ++pp) std::fill(pt2 + pp * BM, pt2 + pp * BM + mp, 0u);
      amx_gemm<Tiles>(dvp, mp, npp, vpairs, BN / 2, pt2, BM, acc, BM, true);
    } else if (interior) {
      dp_gemm<Tr::mr, Tr::nv>(mc, dvp, np, MatW{pt2 + c0, 1, BM}, vpairs, dvp, acc + c0 * dvp, dvp, true);
    } else {
      // A diagonal tile, a vector of queries at a time over the key pairs its
      // last query sees (forward_impl.h).
      for (std::int64_t r = c0; r < c0 + mc; r += S::W) {
        const std::int64_t mr = std::min<std::int64_t>(S::W, c0 + mc - r);
        const std::int64_t kr = std::clamp<std::int64_t>(p.keys(i0 + r + mr - 1, span).end - j0, 0, n);
        if (kr > 0) {
          dp_gemm<Tr::mr, Tr::nv>(mr, dvp, (kr + 1) / 2, MatW{pt2 + r, 1, BM}, vpairs, dvp, acc + r * dvp, dvp, true);
        }
      }
    }
  }

  if (folded) fold(acc, acc2, acc, row_sum, sum2, row_sum, false);
  // The row ends take the softmax state's place (alpha's is free now).
  const float *lse = row_max, *inv = row_sum, *empty = alpha;
  if (raw) {
    for (std::int64_t r = 0; r < m; ++r) row_max[r] *= p.scale;
  }
  finish_rows<S>(m, p.sinks(h), row_max, row_sum, alpha);
  for (std::int64_t r = 0; r < m; ++r) {
    const std::int64_t row = span.q_begin + i0 + r;
    // An empty row is 0 whatever its accumulator met (docs/semantics.md, non-finite inputs).
    const auto at = [&](std::int64_t d) {
      return empty[r] != 0.0f ? 0.0f : (kAmx ? acc[d * BM + r] : acc[r * dvp + d]) * inv[r];
    };
    if (p.out_f32) {  // a forward partial (spec.out_dtype = f32)
      float* dst = p.out_as<float>() + p.so.offset(b, row, h);
      for (std::int64_t d = 0; d < dv; ++d) dst[d] = at(d);
    } else {
      bf16_t* dst = p.out_as<bf16_t>() + p.so.offset(b, row, h);
      for (std::int64_t d = 0; d < dv; ++d) dst[d] = bf16_t(at(d));
    }
    p.lse[p.slse.offset(b, row, h)] = lse[r];
  }
  // Back to the init state: the OS then need not save this thread's tile data.
  if constexpr (kAmx) Tiles::release();
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
