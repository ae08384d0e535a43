// Flash forward for one (batch, query head, query block): online softmax over
// key blocks, never materialising more than a block_m x block_n score tile.
// Included inside an ISA namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"

namespace attend::flash::ATTEND_FLASH_ISA {

template <class S>
void forward_block(const FlashParams& p, std::int64_t b, std::int64_t h, std::int64_t qb, float* scratch) {
  using Tr = KernelTraits<S>;
  constexpr std::int64_t BM = Tr::block_m, BN = Tr::block_n;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const detail::SeqSpan span = p.span(b);
  const std::int64_t i0 = qb * BM, m = std::min(BM, span.q_len - i0);
  if (m <= 0) return;
  const std::int64_t hk = h / p.group, dqk = p.dqk, dv = p.dv, dvp = round_up(dv, S::W);

  float* qs = scratch;               // BM x dqk, pre-scaled
  float* kt = qs + BM * dqk;         // dqk x BN (K transposed)
  float* vs = kt + dqk * BN;         // BN x dvp
  float* st = vs + BN * dvp;         // BM x BN scores, then probabilities
  float* acc = st + BM * BN;         // BM x dvp output accumulator
  float* row_max = acc + BM * dvp;   // BM
  float* row_sum = row_max + BM;     // BM

  for (std::int64_t r = 0; r < m; ++r) {
    const float* src = p.q + p.sq.offset(b, span.q_begin + i0 + r, h);
    for (std::int64_t d = 0; d < dqk; ++d) qs[r * dqk + d] = src[d] * p.scale;
    row_max[r] = kNegInf;
    row_sum[r] = 0.0f;
  }
  std::fill(acc, acc + m * dvp, 0.0f);

  // Keys any row of the block can see: visible ranges only grow with i.
  const detail::KeyRange first = p.keys(i0, span), last = p.keys(i0 + m - 1, span);
  const std::int64_t key_lo = first.begin, key_hi = last.end;
  const bool plain = p.softcap == 0 && !p.alibi && !p.bias;
  for (std::int64_t j0 = key_lo; j0 < key_hi; j0 += BN) {
    const std::int64_t n = std::min(BN, key_hi - j0), n_pad = round_up(n, S::W);
    for (std::int64_t j = 0; j < n; ++j) {
      const float* ksrc = p.k + p.sk.offset(b, span.kv_begin + j0 + j, hk);
      for (std::int64_t d = 0; d < dqk; ++d) kt[d * BN + j] = ksrc[d];
      const float* vsrc = p.v + p.sv.offset(b, span.kv_begin + j0 + j, hk);
      std::copy(vsrc, vsrc + dv, vs + j * dvp);
      std::fill(vs + j * dvp + dv, vs + (j + 1) * dvp, 0.0f);
    }
    for (std::int64_t j = n; j < n_pad; ++j) {
      for (std::int64_t d = 0; d < dqk; ++d) kt[d * BN + j] = 0.0f;
      std::fill(vs + j * dvp, vs + (j + 1) * dvp, 0.0f);
    }

    gemm<S, Tr::mr, Tr::nv>(m, n_pad, dqk, qs, dqk, kt, BN, st, BN, false);

    // Interior tiles (every row sees every key) of a plain problem skip masking.
    const bool interior = n == n_pad && last.begin <= j0 && first.end >= j0 + n;
    if (!(plain && interior)) {
      finish_logits<S>(p, TileCoords{b, h, i0, m, j0, n, n_pad, span}, st, BN, nullptr);
    }

    // Online softmax: rescale what was accumulated when the running max grows.
    for (std::int64_t r = 0; r < m; ++r) {
      float* row = st + r * BN;
      typename S::V vmax = S::set1(kNegInf);
      for (std::int64_t j = 0; j < n_pad; j += S::W) vmax = S::max(vmax, S::load(row + j));
      const float new_max = std::max(row_max[r], S::reduce_max(vmax));
      if (new_max == kNegInf) {  // nothing visible yet in this row
        std::fill(row, row + n_pad, 0.0f);
        continue;
      }
      const float alpha = std::exp(row_max[r] - new_max);  // exp(-inf) = 0 on first visit
      row_max[r] = new_max;
      const typename S::V vm = S::set1(new_max);
      typename S::V vsum = S::zero();
      for (std::int64_t j = 0; j < n_pad; j += S::W) {
        const typename S::V e = S::exp(S::sub(S::load(row + j), vm));
        S::store(row + j, e);
        vsum = S::add(vsum, e);
      }
      row_sum[r] = row_sum[r] * alpha + S::reduce_add(vsum);
      if (alpha != 1.0f) {
        const typename S::V va = S::set1(alpha);
        float* o = acc + r * dvp;
        for (std::int64_t d = 0; d < dvp; d += S::W) S::store(o + d, S::mul(S::load(o + d), va));
      }
    }
    // Dropout acts on P after the row sums (LSE and normalisation are pre-dropout).
    if (p.dropout) apply_dropout(p, TileCoords{b, h, i0, m, j0, n, n_pad, span}, st, BN);

    gemm<S, Tr::mr, Tr::nv>(m, dvp, n_pad, st, BN, vs, dvp, acc, dvp, true);
  }

  for (std::int64_t r = 0; r < m; ++r) {
    const std::int64_t row = span.q_begin + i0 + r;
    float* dst = p.out + p.so.offset(b, row, h);
    const float l = row_sum[r];
    const float inv = l > 0 ? 1.0f / l : 0.0f;  // empty row: O = 0
    for (std::int64_t d = 0; d < dv; ++d) dst[d] = acc[r * dvp + d] * inv;
    p.lse[p.slse.offset(b, row, h)] = l > 0 ? row_max[r] + std::log(l) : kNegInf;
  }
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
