// Flash backward for one (batch, kv head): for each key block, sweep every
// query block of every query head in the GQA group, recompute P from the saved
// LSE, and accumulate dK/dV in the tile and dQ in the output. One task owns all
// writes to its dK/dV rows and its group's dQ rows, so the result is bitwise
// identical for any thread count, without atomics or extra buffers.
// Included inside an ISA namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"

namespace attend::flash::ATTEND_FLASH_ISA {

// dst[c x r] = src[r x c]^T, ld in floats.
inline void transpose(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t lds, float* dst,
                      std::int64_t ldd) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
  }
}

template <class S>
void backward_head(const FlashParams& p, std::int64_t b, std::int64_t hk, float* scratch) {
  using Tr = KernelTraits<S>;
  constexpr std::int64_t BM = Tr::block_m, BN = Tr::block_n;
  constexpr int MR = Tr::mr, NV = Tr::nv;
  const detail::SeqSpan span = p.span(b);
  const std::int64_t dqk = p.dqk, dv = p.dv, dqp = round_up(dqk, S::W), dvp = round_up(dv, S::W);

  float* kt = scratch;            // dqk x BN   K^T, for S = Q K^T
  float* ks = kt + dqk * BN;      // BN x dqp   K,   for dQ = dS K
  float* vt = ks + BN * dqp;      // dv x BN    V^T, for dP = dO V^T
  float* dk_acc = vt + dv * BN;   // BN x dqp
  float* dv_acc = dk_acc + BN * dqp;  // BN x dvp
  float* qs = dv_acc + BN * dvp;  // BM x dqp   scale * Q
  float* dos = qs + BM * dqp;     // BM x dvp   dO
  float* pt = dos + BM * dvp;     // BM x BN    P (then dS)
  float* dpt = pt + BM * BN;      // BM x BN    dP (then tanh for softcap)
  float* tr = dpt + BM * BN;      // BN x BM    transposed P' or dS
  float* dq_tile = tr + BN * BM;  // BM x dqp
  float* dsum = dq_tile + BM * dqp;  // BM  D_i = dO_i . O_i
  float* lse = dsum + BM;         // BM
  float* tanh_buf = nullptr;      // softcap keeps tanh in dpt's sibling: see below

  for (std::int64_t g = 0; g < p.group; ++g) {  // this task owns these dQ rows
    const std::int64_t h = hk * p.group + g;
    for (std::int64_t i = 0; i < span.q_len; ++i) {
      float* dst = p.dq + p.sdq.offset(b, span.q_begin + i, h);
      std::fill(dst, dst + dqk, 0.0f);
    }
  }

  for (std::int64_t j0 = 0; j0 < span.kv_len; j0 += BN) {
    const std::int64_t n = std::min(BN, span.kv_len - j0), n_pad = round_up(n, S::W);
    for (std::int64_t j = 0; j < n_pad; ++j) {
      const bool real = j < n;
      const float* ksrc = real ? p.k + p.sk.offset(b, span.kv_begin + j0 + j, hk) : nullptr;
      const float* vsrc = real ? p.v + p.sv.offset(b, span.kv_begin + j0 + j, hk) : nullptr;
      for (std::int64_t d = 0; d < dqk; ++d) kt[d * BN + j] = real ? ksrc[d] : 0.0f;
      for (std::int64_t d = 0; d < dqp; ++d) ks[j * dqp + d] = real && d < dqk ? ksrc[d] : 0.0f;
      for (std::int64_t d = 0; d < dv; ++d) vt[d * BN + j] = real ? vsrc[d] : 0.0f;
    }
    std::fill(dk_acc, dk_acc + BN * dqp, 0.0f);
    std::fill(dv_acc, dv_acc + BN * dvp, 0.0f);

    for (std::int64_t g = 0; g < p.group; ++g) {
      const std::int64_t h = hk * p.group + g;
      for (std::int64_t i0 = 0; i0 < span.q_len; i0 += BM) {
        const std::int64_t m = std::min(BM, span.q_len - i0);
        // Skip query blocks that see none of these keys (causal / window).
        const detail::KeyRange first = p.keys(i0, span), last = p.keys(i0 + m - 1, span);
        if (first.begin >= j0 + n || last.end <= j0 || last.end <= first.begin) continue;

        for (std::int64_t r = 0; r < m; ++r) {
          const std::int64_t row = span.q_begin + i0 + r;
          const float* qsrc = p.q + p.sq.offset(b, row, h);
          const float* dosrc = p.dout + p.sdo.offset(b, row, h);
          const float* osrc = p.out + p.so.offset(b, row, h);
          float dot = 0.0f;
          for (std::int64_t d = 0; d < dv; ++d) dot += dosrc[d] * osrc[d];
          dsum[r] = dot;
          lse[r] = p.lse[p.slse.offset(b, row, h)];
          for (std::int64_t d = 0; d < dqp; ++d) qs[r * dqp + d] = d < dqk ? qsrc[d] * p.scale : 0.0f;
          for (std::int64_t d = 0; d < dvp; ++d) dos[r * dvp + d] = d < dv ? dosrc[d] : 0.0f;
        }

        // Recompute logits exactly as the forward did, then P = exp(s - LSE).
        gemm<S, MR, NV>(m, n_pad, dqk, qs, dqp, kt, BN, pt, BN, false);
        const TileCoords t{b, h, i0, m, j0, n, n_pad, span};
        tanh_buf = p.softcap > 0 ? tr : nullptr;  // tr is free until the transposes below
        finish_logits<S>(p, t, pt, BN, tanh_buf);
        for (std::int64_t r = 0; r < m; ++r) {
          float* row = pt + r * BN;
          if (lse[r] == -std::numeric_limits<float>::infinity()) {
            std::fill(row, row + n_pad, 0.0f);  // empty row: no gradient
            continue;
          }
          const typename S::V vl = S::set1(lse[r]);
          for (std::int64_t j = 0; j < n_pad; j += S::W) S::store(row + j, S::exp(S::sub(S::load(row + j), vl)));
        }

        // dP' = dO V^T; dS = P * (dP' * keep/(1-p) - D)  [* (1 - tanh^2) under softcap]
        gemm<S, MR, NV>(m, n_pad, dv, dos, dvp, vt, BN, dpt, BN, false);
        if (p.dropout) apply_dropout(p, t, dpt, BN);
        for (std::int64_t r = 0; r < m; ++r) {
          const typename S::V vd = S::set1(dsum[r]);
          float* prow = pt + r * BN;
          float* dprow = dpt + r * BN;
          for (std::int64_t j = 0; j < n_pad; j += S::W) {
            typename S::V ds = S::mul(S::load(prow + j), S::sub(S::load(dprow + j), vd));
            if (tanh_buf) {
              const typename S::V th = S::load(tanh_buf + r * BN + j);
              ds = S::mul(ds, S::sub(S::set1(1.0f), S::mul(th, th)));
            }
            S::store(dprow + j, ds);  // dpt now holds dS
          }
        }

        // dV += P'^T dO  (P' = P with dropout applied)
        if (p.dropout) apply_dropout(p, t, pt, BN);
        transpose(pt, m, n, BN, tr, BM);
        gemm<S, MR, NV>(n, dvp, m, tr, BM, dos, dvp, dv_acc, dvp, true);

        // dK += dS^T (scale Q);  dQ += scale * dS K
        transpose(dpt, m, n, BN, tr, BM);
        gemm<S, MR, NV>(n, dqp, m, tr, BM, qs, dqp, dk_acc, dqp, true);
        gemm<S, MR, NV>(m, dqp, n_pad, dpt, BN, ks, dqp, dq_tile, dqp, false);
        for (std::int64_t r = 0; r < m; ++r) {
          float* dst = p.dq + p.sdq.offset(b, span.q_begin + i0 + r, h);
          for (std::int64_t d = 0; d < dqk; ++d) dst[d] += p.scale * dq_tile[r * dqp + d];
        }
      }
    }

    for (std::int64_t j = 0; j < n; ++j) {
      float* dkd = p.dk + p.sdk.offset(b, span.kv_begin + j0 + j, hk);
      float* dvd = p.dv_out + p.sdv.offset(b, span.kv_begin + j0 + j, hk);
      std::copy(dk_acc + j * dqp, dk_acc + j * dqp + dqk, dkd);
      std::copy(dv_acc + j * dvp, dv_acc + j * dvp + dv, dvd);
    }
  }
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
