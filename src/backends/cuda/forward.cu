// Forward: FlashAttention-2's loop on CUDA cores. A block of 256 threads owns
// 64 query rows of one (sequence, head) and walks the 64-key tiles its rows
// see, keeping the running max, sum and O rows in registers. Threads form a
// 16 x 16 grid: thread (rg, cg) holds rows 4rg..4rg+3 against keys 4cg..4cg+3
// of the score tile, and the same rows against value columns 4(cg + 16jj)..+3
// of O, so a row's 16 threads sit in one half-warp and its max and sum are
// shuffles. Tiles are stored for 128-bit shared loads without bank conflicts:
// Q and K transposed (head dim outermost), V and P row-major.
#include <algorithm>

#include "backends/cuda/cuda_common.cuh"

namespace attend::cuda {
namespace {

constexpr int kBM = 64, kBN = 64;
constexpr int kLdP = kBN + 4;  // P's row pitch: a quarter warp's 128-bit stores hit distinct banks

i64 pad4(i64 n) { return (n + 3) / 4 * 4; }

// Shared floats: Q^T [dq4][64], K^T [dq4][64], V [64][DVM], P [64][kLdP].
std::size_t smem_floats(i64 dqk, int dvm) {
  return static_cast<std::size_t>(2 * pad4(dqk) * kBM + kBN * dvm + kBM * kLdP);
}

template <typename T, int DVM>
__global__ void __launch_bounds__(kThreads) forward_kernel(const CudaParams p) {
  constexpr int JJ = DVM / 64;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int dq4 = static_cast<int>((p.dqk + 3) / 4 * 4);
  float* Qt = smem;
  float* Kt = Qt + dq4 * kBM;
  float* Vs = Kt + dq4 * kBN;
  float* Ps = Vs + kBN * DVM;

  const int tid = static_cast<int>(threadIdx.x), cg = tid & 15, rg = tid >> 4;
  const i64 b = blockIdx.z, h = blockIdx.y, i0 = static_cast<i64>(blockIdx.x) * kBM;
  const detail::SeqSpan s = p.seqs(b);
  if (i0 >= s.q_len) return;  // the whole block: before any barrier
  const i64 hk = h / p.group;
  const int rows = static_cast<int>(min(static_cast<i64>(kBM), s.q_len - i0));
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);

  // Q^T: consecutive threads take consecutive rows, so the transposed stores are conflict-free.
  for (int idx = tid; idx < kBM * (dq4 / 4); idx += kThreads) {
    const int r = idx % kBM, d = idx / kBM * 4;
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (r < rows) load4(q + p.sq.offset(b, s.q_begin + i0 + r, h) + d, static_cast<int>(p.dqk - d), x);
#pragma unroll
    for (int c = 0; c < 4; ++c) Qt[(d + c) * kBM + r] = x[c];
  }

  RowTerms<T> terms[4] = {RowTerms<T>(p, b, h, i0 + rg * 4 + 0, s), RowTerms<T>(p, b, h, i0 + rg * 4 + 1, s),
                          RowTerms<T>(p, b, h, i0 + rg * 4 + 2, s), RowTerms<T>(p, b, h, i0 + rg * 4 + 3, s)};
  // Rows' visible ranges only move right with i: the block's keys are one interval.
  const i64 j_begin = detail::visible_keys(p.mask, i0, s.q_len, s.kv_len).begin;
  const i64 j_end = detail::visible_keys(p.mask, i0 + rows - 1, s.q_len, s.kv_len).end;

  float m[4], l[4], o[4][JJ][4];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.0f;
#pragma unroll
    for (int jj = 0; jj < JJ; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[a][jj][e] = 0.0f;
  }

  for (i64 j0 = j_begin; j0 < j_end; j0 += kBN) {
    const int cols = static_cast<int>(min(static_cast<i64>(kBN), j_end - j0));
    __syncthreads();  // the previous tile's K, V and P are consumed
    for (int idx = tid; idx < kBN * (dq4 / 4); idx += kThreads) {
      const int c = idx % kBN, d = idx / kBN * 4;
      float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (c < cols) load4(k + p.sk.offset(b, s.kv_begin + j0 + c, hk) + d, static_cast<int>(p.dqk - d), x);
#pragma unroll
      for (int e = 0; e < 4; ++e) Kt[(d + e) * kBN + c] = x[e];
    }
    for (int idx = tid; idx < kBN * (DVM / 4); idx += kThreads) {
      const int c = idx / (DVM / 4), d = idx % (DVM / 4) * 4;
      float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (c < cols && d < p.dv) load4(v + p.sv.offset(b, s.kv_begin + j0 + c, hk) + d, static_cast<int>(p.dv - d), x);
      *reinterpret_cast<float4*>(Vs + c * DVM + d) = make_float4(x[0], x[1], x[2], x[3]);
    }
    __syncthreads();

    float sc[4][4] = {};
#pragma unroll 4
    for (int d = 0; d < dq4; ++d) {
      const float4 qa = *reinterpret_cast<const float4*>(Qt + d * kBM + rg * 4);
      const float4 kb = *reinterpret_cast<const float4*>(Kt + d * kBN + cg * 4);
      const float qv[4] = {qa.x, qa.y, qa.z, qa.w}, kv[4] = {kb.x, kb.y, kb.z, kb.w};
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[a][e] = fmaf(qv[a], kv[e], sc[a][e]);
    }

#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const i64 i = i0 + rg * 4 + a;
      float x[4], mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float dcap;
        x[e] = terms[a].logit(p, sc[a][e], j0 + cg * 4 + e, &dcap);
        mx = nan_max(mx, x[e]);
      }
      const float m_new = nan_max(m[a], row_max16(mx));
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet stays 0
      const float corr = expf(m[a] - base);
      float pe[4], rs = 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) rs += (pe[e] = expf(x[e] - base));
      l[a] = l[a] * corr + row_sum16(rs);
      m[a] = m_new;
#pragma unroll
      for (int jj = 0; jj < JJ; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[a][jj][e] *= corr;
      if (p.dropout) {
#pragma unroll
        for (int e = 0; e < 4; ++e) pe[e] *= dropout_factor(p, b, h, i, j0 + cg * 4 + e);
      }
      *reinterpret_cast<float4*>(Ps + (rg * 4 + a) * kLdP + cg * 4) = make_float4(pe[0], pe[1], pe[2], pe[3]);
    }
    __syncthreads();

    const int cols4 = (cols + 3) / 4 * 4;
    for (int c = 0; c < cols4; c += 4) {
      float4 pr[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) pr[a] = *reinterpret_cast<const float4*>(Ps + (rg * 4 + a) * kLdP + c);
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
#pragma unroll
        for (int jj = 0; jj < JJ; ++jj) {
          const float4 vv = *reinterpret_cast<const float4*>(Vs + (c + cc) * DVM + 4 * (cg + 16 * jj));
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            const float pa = cc == 0 ? pr[a].x : cc == 1 ? pr[a].y : cc == 2 ? pr[a].z : pr[a].w;
            o[a][jj][0] = fmaf(pa, vv.x, o[a][jj][0]);
            o[a][jj][1] = fmaf(pa, vv.y, o[a][jj][1]);
            o[a][jj][2] = fmaf(pa, vv.z, o[a][jj][2]);
            o[a][jj][3] = fmaf(pa, vv.w, o[a][jj][3]);
          }
        }
      }
    }
  }

  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int r = rg * 4 + a;
    if (r >= rows) continue;
    const i64 i = i0 + r;
    // l == 0: no visible key (or all -inf): O = 0 and LSE = -inf. A NaN l stays NaN.
    const float inv = l[a] == 0.0f ? 0.0f : 1.0f / l[a];
    T* orow = out + p.so.offset(b, s.q_begin + i, h);
#pragma unroll
    for (int jj = 0; jj < JJ; ++jj) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 4 * (cg + 16 * jj) + e;
        if (col < p.dv) orow[col] = from_f32<T>(o[a][jj][e] * inv);
      }
    }
    if (cg == 0) p.lse[p.slse.offset(b, s.q_begin + i, h)] = l[a] == 0.0f ? -INFINITY : m[a] + logf(l[a]);
  }
}

template <typename T, int DVM>
void launch(const CudaParams& p, cudaStream_t stream) {
  launch_with_smem(forward_kernel<T, DVM>, p, query_block_grid(p, kBM), kThreads,
                   smem_floats(p.dqk, DVM) * sizeof(float), stream, "forward (simt) launch");
}

template <typename T>
void launch_dtype(const CudaParams& p, cudaStream_t stream) {
  with_dim_bucket(p.dv, [&](auto dvm) { launch<T, decltype(dvm)::value>(p, stream); });
}

}  // namespace

std::size_t forward_smem_bytes(std::int64_t dqk, std::int64_t dv) {
  return smem_floats(dqk, dim_bucket(dv)) * sizeof(float);
}

void launch_forward(const CudaParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0) return;
  switch (p.dtype) {
    case DType::bf16: return launch_dtype<__nv_bfloat16>(p, stream);
    case DType::f16: return launch_dtype<__half>(p, stream);
    default: return launch_dtype<float>(p, stream);
  }
}

}  // namespace attend::cuda
