// Backward: FlashAttention-2's key-block loop on CUDA cores, in three kernels.
//   1. delta: D_i = dO_i . O_i for every query row and head;
//   2. key blocks: a block of 256 threads owns 64 keys of one (sequence, kv
//      head), keeps their dK and dV in registers, and walks the query rows of
//      every head of its GQA group that see them, 32 at a time: S and dP are
//      recomputed, dV += P'^T dO, dK += dS^T Q, and dS K is added to an f32 dQ
//      sum in the workspace with atomics (so the order of additions, and the
//      last bits of dQ, vary between runs: the check declines deterministic);
//   3. dq: the f32 sum converted to dq's dtype (or added to dq).
// Thread (rg, cg) of the 16 x 16 grid holds score rows 2rg..2rg+1 against keys
// 4cg..4cg+3, key rows 4rg..4rg+3 of dK/dV and rows 2rg..2rg+1 of the dQ
// tile, against columns 4(cg + 16jj)..+3. Each operand sits in shared memory
// in the orientation its product reads with 128-bit loads (K, Q and dO both ways).
#include <algorithm>

#include "backends/cuda/cuda_common.cuh"

namespace attend::cuda {
namespace {

constexpr int kBN = 64, kBM = 32;
constexpr int kLdP = kBN + 4;   // P and dS rows: [kBM][kLdP]
constexpr int kLdSt = kBM + 4;  // dS^T rows: [kBN][kLdSt]

// Shared floats, in carving order.
struct Carve {
  int dq4, dv4, dqm, dvm;
  __host__ __device__ std::size_t ks() const { return 0; }                                            // K   [kBN][dqm]
  __host__ __device__ std::size_t kt() const { return ks() + static_cast<std::size_t>(kBN) * dqm; }   // K^T [dq4][kBN]
  __host__ __device__ std::size_t vt() const { return kt() + static_cast<std::size_t>(dq4) * kBN; }   // V^T [dv4][kBN]
  __host__ __device__ std::size_t qs() const { return vt() + static_cast<std::size_t>(dv4) * kBN; }   // Q   [kBM][dqm]
  __host__ __device__ std::size_t qt() const { return qs() + static_cast<std::size_t>(kBM) * dqm; }   // Q^T [dq4][kBM]
  __host__ __device__ std::size_t dos() const { return qt() + static_cast<std::size_t>(dq4) * kBM; }  // dO  [kBM][dvm]
  __host__ __device__ std::size_t dot() const {
    return dos() + static_cast<std::size_t>(kBM) * dvm;
  }                                                                                                   // dO^T [dv4][kBM]
  __host__ __device__ std::size_t ps() const { return dot() + static_cast<std::size_t>(dv4) * kBM; }  // P'  [kBM][kLdP]
  __host__ __device__ std::size_t dss() const {
    return ps() + static_cast<std::size_t>(kBM) * kLdP;
  }  // dS  [kBM][kLdP]
  __host__ __device__ std::size_t dst() const {
    return dss() + static_cast<std::size_t>(kBM) * kLdP;
  }  // dS^T [kBN][kLdSt]
  __host__ __device__ std::size_t rowv() const {
    return dst() + static_cast<std::size_t>(kBN) * kLdSt;
  }  // LSE, D [2][kBM]
  __host__ __device__ std::size_t total() const { return rowv() + 2 * kBM; }
};

__host__ __device__ inline Carve carve(i64 dqk, i64 dv, int dqm, int dvm) {
  return {static_cast<int>((dqk + 3) / 4 * 4), static_cast<int>((dv + 3) / 4 * 4), dqm, dvm};
}

// (sequence, row in it) of workspace row r: the inverse of row_index for dense
// layouts; varlen rows are addressed by their packed index (b unused there).
__device__ inline void split_row(const CudaParams& p, i64 r, i64* b, i64* i) {
  if (p.varlen) {
    *b = 0;
    *i = r;
  } else {
    *b = r / p.seqlen_q;
    *i = r % p.seqlen_q;
  }
}

// One warp per (row, head): D = dO . O over head_dim_v.
template <typename T>
__global__ void __launch_bounds__(kThreads) delta_kernel(const CudaParams p) {
  const i64 warp = (static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (warp >= p.rows * p.heads_q) return;
  const i64 r = warp / p.heads_q, h = warp % p.heads_q;
  i64 b, i;
  split_row(p, r, &b, &i);
  const T* o = static_cast<const T*>(p.out) + p.so.offset(b, i, h);
  const T* g = static_cast<const T*>(p.dout) + p.sdo.offset(b, i, h);
  float acc = 0.0f;
  for (i64 d = lane; d < p.dv; d += 32) acc = fmaf(to_f32(o[d]), to_f32(g[d]), acc);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) p.delta[h * p.rows + r] = acc;
}

template <typename T, int DQM, int DVM>
__global__ void __launch_bounds__(kThreads) key_block_kernel(const CudaParams p) {
  constexpr int JQ = DQM / 64, JV = DVM / 64;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const Carve cv = carve(p.dqk, p.dv, DQM, DVM);
  float* Ks = smem + cv.ks();
  float* Kt = smem + cv.kt();
  float* Vt = smem + cv.vt();
  float* Qs = smem + cv.qs();
  float* Qt = smem + cv.qt();
  float* dOs = smem + cv.dos();
  float* dOt = smem + cv.dot();
  float* Ps = smem + cv.ps();
  float* dSs = smem + cv.dss();
  float* dSt = smem + cv.dst();
  float* lse_s = smem + cv.rowv();
  float* delta_s = lse_s + kBM;

  const int tid = static_cast<int>(threadIdx.x), cg = tid & 15, rg = tid >> 4;
  const i64 b = blockIdx.z, hk = blockIdx.y, j0 = static_cast<i64>(blockIdx.x) * kBN;
  const detail::SeqSpan s = p.seqs(b);
  if (j0 >= s.kv_len) return;  // the whole block: before any barrier
  const int cols = static_cast<int>(min(static_cast<i64>(kBN), s.kv_len - j0));
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const T* q = static_cast<const T*>(p.q);
  const T* dout = static_cast<const T*>(p.dout);

  // K both ways and V^T: consecutive threads take consecutive keys for the
  // transposed stores, a row's float4 chunks for the row-major one.
  for (int idx = tid; idx < kBN * (cv.dq4 / 4); idx += kThreads) {
    const int c = idx % kBN, d = idx / kBN * 4;
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (c < cols) load4(k + p.sk.offset(b, s.kv_begin + j0 + c, hk) + d, static_cast<int>(p.dqk - d), x);
#pragma unroll
    for (int e = 0; e < 4; ++e) Kt[(d + e) * kBN + c] = x[e];
  }
  for (int idx = tid; idx < kBN * (DQM / 4); idx += kThreads) {
    const int c = idx / (DQM / 4), d = idx % (DQM / 4) * 4;
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (c < cols && d < p.dqk) load4(k + p.sk.offset(b, s.kv_begin + j0 + c, hk) + d, static_cast<int>(p.dqk - d), x);
    *reinterpret_cast<float4*>(Ks + c * DQM + d) = make_float4(x[0], x[1], x[2], x[3]);
  }
  for (int idx = tid; idx < kBN * (cv.dv4 / 4); idx += kThreads) {
    const int c = idx % kBN, d = idx / kBN * 4;
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (c < cols) load4(v + p.sv.offset(b, s.kv_begin + j0 + c, hk) + d, static_cast<int>(p.dv - d), x);
#pragma unroll
    for (int e = 0; e < 4; ++e) Vt[(d + e) * kBN + c] = x[e];
  }

  float dk[4][JQ][4] = {}, dv[4][JV][4] = {};
  // Queries that see any of these keys: visible query ranges move right with j.
  const i64 q_first = detail::visible_queries(p.mask, j0, s.q_len, s.kv_len).begin;
  const i64 q_end = detail::visible_queries(p.mask, j0 + cols - 1, s.q_len, s.kv_len).end;

  for (i64 g = 0; g < p.group; ++g) {
    const i64 h = hk * p.group + g;
    for (i64 i0 = q_first; i0 < q_end; i0 += kBM) {
      const int rows = static_cast<int>(min(static_cast<i64>(kBM), q_end - i0));
      __syncthreads();  // the previous query tile is consumed (and K/V are stored, the first time)
      for (int idx = tid; idx < kBM * (cv.dq4 / 4); idx += kThreads) {
        const int r = idx % kBM, d = idx / kBM * 4;
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < rows) load4(q + p.sq.offset(b, s.q_begin + i0 + r, h) + d, static_cast<int>(p.dqk - d), x);
#pragma unroll
        for (int e = 0; e < 4; ++e) Qt[(d + e) * kBM + r] = x[e];
      }
      for (int idx = tid; idx < kBM * (DQM / 4); idx += kThreads) {
        const int r = idx / (DQM / 4), d = idx % (DQM / 4) * 4;
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < rows && d < p.dqk) load4(q + p.sq.offset(b, s.q_begin + i0 + r, h) + d, static_cast<int>(p.dqk - d), x);
        *reinterpret_cast<float4*>(Qs + r * DQM + d) = make_float4(x[0], x[1], x[2], x[3]);
      }
      for (int idx = tid; idx < kBM * (cv.dv4 / 4); idx += kThreads) {
        const int r = idx % kBM, d = idx / kBM * 4;
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < rows) load4(dout + p.sdo.offset(b, s.q_begin + i0 + r, h) + d, static_cast<int>(p.dv - d), x);
#pragma unroll
        for (int e = 0; e < 4; ++e) dOt[(d + e) * kBM + r] = x[e];
      }
      for (int idx = tid; idx < kBM * (DVM / 4); idx += kThreads) {
        const int r = idx / (DVM / 4), d = idx % (DVM / 4) * 4;
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < rows && d < p.dv)
          load4(dout + p.sdo.offset(b, s.q_begin + i0 + r, h) + d, static_cast<int>(p.dv - d), x);
        *reinterpret_cast<float4*>(dOs + r * DVM + d) = make_float4(x[0], x[1], x[2], x[3]);
      }
      if (tid < kBM) {
        const bool in = tid < rows;
        lse_s[tid] = in ? p.lse[p.slse.offset(b, s.q_begin + i0 + tid, h)] : -INFINITY;
        delta_s[tid] = in ? p.delta[h * p.rows + row_index(p, b, s, i0 + tid)] : 0.0f;
      }
      __syncthreads();

      // S = Q K^T and dP = dO V^T for rows 2rg..2rg+1, keys 4cg..4cg+3.
      float sc[2][4] = {}, dp[2][4] = {};
#pragma unroll 4
      for (int d = 0; d < cv.dq4; ++d) {
        const float2 qa = *reinterpret_cast<const float2*>(Qt + d * kBM + rg * 2);
        const float4 kb = *reinterpret_cast<const float4*>(Kt + d * kBN + cg * 4);
        const float qv[2] = {qa.x, qa.y}, kv[4] = {kb.x, kb.y, kb.z, kb.w};
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[a][e] = fmaf(qv[a], kv[e], sc[a][e]);
      }
#pragma unroll 4
      for (int d = 0; d < cv.dv4; ++d) {
        const float2 ga = *reinterpret_cast<const float2*>(dOt + d * kBM + rg * 2);
        const float4 vb = *reinterpret_cast<const float4*>(Vt + d * kBN + cg * 4);
        const float gv[2] = {ga.x, ga.y}, vv[4] = {vb.x, vb.y, vb.z, vb.w};
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
          for (int e = 0; e < 4; ++e) dp[a][e] = fmaf(gv[a], vv[e], dp[a][e]);
      }

#pragma unroll
      for (int a = 0; a < 2; ++a) {
        const int r = rg * 2 + a;
        const i64 i = i0 + r;
        const RowTerms<T> terms(p, b, h, r < rows ? i : s.q_len, s);  // past the tile: no keys
        const float lse = lse_s[r], dlt = delta_s[r];
        float pd[4], ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const i64 j = j0 + cg * 4 + e;
          float dcap;
          const float x = terms.logit(p, sc[a][e], j, &dcap);
          // A row whose LSE is -inf saw no key: P = 0 (exp(-inf - -inf) would be NaN).
          const float pr = (x == -INFINITY || lse == -INFINITY) ? 0.0f : expf(x - lse);
          const float f = dropout_factor(p, b, h, i, j);
          pd[e] = pr * f;
          ds[e] = pr * (dp[a][e] * f - dlt) * dcap * p.scale;
        }
        *reinterpret_cast<float4*>(Ps + r * kLdP + cg * 4) = make_float4(pd[0], pd[1], pd[2], pd[3]);
        *reinterpret_cast<float4*>(dSs + r * kLdP + cg * 4) = make_float4(ds[0], ds[1], ds[2], ds[3]);
#pragma unroll
        for (int e = 0; e < 4; ++e) dSt[(cg * 4 + e) * kLdSt + r] = ds[e];
      }
      __syncthreads();

      // dV += P'^T dO and dK += dS^T Q for keys 4rg..4rg+3.
      for (int r = 0; r < rows; ++r) {
        const float4 pa = *reinterpret_cast<const float4*>(Ps + r * kLdP + rg * 4);
        const float4 sa = *reinterpret_cast<const float4*>(dSs + r * kLdP + rg * 4);
        const float pv[4] = {pa.x, pa.y, pa.z, pa.w}, sv[4] = {sa.x, sa.y, sa.z, sa.w};
#pragma unroll
        for (int jj = 0; jj < JV; ++jj) {
          const float4 gb = *reinterpret_cast<const float4*>(dOs + r * DVM + 4 * (cg + 16 * jj));
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            dv[a][jj][0] = fmaf(pv[a], gb.x, dv[a][jj][0]);
            dv[a][jj][1] = fmaf(pv[a], gb.y, dv[a][jj][1]);
            dv[a][jj][2] = fmaf(pv[a], gb.z, dv[a][jj][2]);
            dv[a][jj][3] = fmaf(pv[a], gb.w, dv[a][jj][3]);
          }
        }
#pragma unroll
        for (int jj = 0; jj < JQ; ++jj) {
          const float4 qb = *reinterpret_cast<const float4*>(Qs + r * DQM + 4 * (cg + 16 * jj));
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            dk[a][jj][0] = fmaf(sv[a], qb.x, dk[a][jj][0]);
            dk[a][jj][1] = fmaf(sv[a], qb.y, dk[a][jj][1]);
            dk[a][jj][2] = fmaf(sv[a], qb.z, dk[a][jj][2]);
            dk[a][jj][3] = fmaf(sv[a], qb.w, dk[a][jj][3]);
          }
        }
      }

      // dQ rows 2rg..2rg+1 += dS K over this block's keys, into the f32 sum.
      float dq[2][JQ][4] = {};
      for (int c = 0; c < cols; ++c) {
        const float2 sa = *reinterpret_cast<const float2*>(dSt + c * kLdSt + rg * 2);
        const float sv[2] = {sa.x, sa.y};
#pragma unroll
        for (int jj = 0; jj < JQ; ++jj) {
          const float4 kb = *reinterpret_cast<const float4*>(Ks + c * DQM + 4 * (cg + 16 * jj));
#pragma unroll
          for (int a = 0; a < 2; ++a) {
            dq[a][jj][0] = fmaf(sv[a], kb.x, dq[a][jj][0]);
            dq[a][jj][1] = fmaf(sv[a], kb.y, dq[a][jj][1]);
            dq[a][jj][2] = fmaf(sv[a], kb.z, dq[a][jj][2]);
            dq[a][jj][3] = fmaf(sv[a], kb.w, dq[a][jj][3]);
          }
        }
      }
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        const int r = rg * 2 + a;
        if (r >= rows) continue;
        float* acc = p.dq_acc + (row_index(p, b, s, i0 + r) * p.heads_q + h) * p.dqk;
#pragma unroll
        for (int jj = 0; jj < JQ; ++jj)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = 4 * (cg + 16 * jj) + e;
            if (col < p.dqk) atomicAdd(acc + col, dq[a][jj][e]);
          }
      }
    }
  }

  T* dk_out = static_cast<T*>(p.grad_k);
  T* dv_out = static_cast<T*>(p.grad_v);
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int c = rg * 4 + a;
    if (c >= cols) continue;
    T* krow = dk_out + p.sgk.offset(b, s.kv_begin + j0 + c, hk);
    T* vrow = dv_out + p.sgv.offset(b, s.kv_begin + j0 + c, hk);
#pragma unroll
    for (int jj = 0; jj < JQ; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 4 * (cg + 16 * jj) + e;
        if (col < p.dqk) krow[col] = from_f32<T>(p.accumulate ? to_f32(krow[col]) + dk[a][jj][e] : dk[a][jj][e]);
      }
#pragma unroll
    for (int jj = 0; jj < JV; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 4 * (cg + 16 * jj) + e;
        if (col < p.dv) vrow[col] = from_f32<T>(p.accumulate ? to_f32(vrow[col]) + dv[a][jj][e] : dv[a][jj][e]);
      }
  }
}

// dq from the f32 sum: one thread per element.
template <typename TQ>
__global__ void __launch_bounds__(kThreads) dq_kernel(const CudaParams p) {
  const i64 n = static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x;
  if (n >= p.rows * p.heads_q * p.dqk) return;
  const i64 d = n % p.dqk, rh = n / p.dqk, h = rh % p.heads_q, r = rh / p.heads_q;
  i64 b, i;
  split_row(p, r, &b, &i);
  TQ* dst = static_cast<TQ*>(p.grad_q) + p.sgq.offset(b, i, h) + d;
  *dst = from_f32<TQ>(p.accumulate ? to_f32(*dst) + p.dq_acc[n] : p.dq_acc[n]);
}

unsigned blocks_for(i64 n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

template <typename T, int DQM, int DVM>
void launch_keys(const CudaParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.seqlen_kv + kBN - 1) / kBN), static_cast<unsigned>(p.heads_kv),
                  static_cast<unsigned>(p.batch));
  launch_with_smem(key_block_kernel<T, DQM, DVM>, p, grid, kThreads,
                   carve(p.dqk, p.dv, DQM, DVM).total() * sizeof(float), stream, "backward key-block launch");
}

template <typename T>
void launch_dtype(const CudaParams& p, cudaStream_t stream) {
  if (p.rows > 0 && p.heads_q > 0) {
    delta_kernel<T><<<blocks_for(p.rows * p.heads_q * 32), kThreads, 0, stream>>>(p);
    check(cudaGetLastError(), "backward delta kernel launch");
  }
  if (p.batch > 0 && p.heads_kv > 0 && p.seqlen_kv > 0) {
    const int dqm = dim_bucket(p.dqk), dvm = dim_bucket(p.dv);  // <= 128: the check
    if (dqm == 64 && dvm == 64) launch_keys<T, 64, 64>(p, stream);
    if (dqm == 64 && dvm == 128) launch_keys<T, 64, 128>(p, stream);
    if (dqm == 128 && dvm == 64) launch_keys<T, 128, 64>(p, stream);
    if (dqm == 128 && dvm == 128) launch_keys<T, 128, 128>(p, stream);
  }
}

}  // namespace

std::size_t backward_smem_bytes(std::int64_t dqk, std::int64_t dv) {
  return carve(dqk, dv, dim_bucket(dqk), dim_bucket(dv)).total() * sizeof(float);
}

void launch_backward(const CudaParams& p, cudaStream_t stream) {
  const i64 n = p.rows * p.heads_q * p.dqk;
  if (n > 0)
    check(cudaMemsetAsync(p.dq_acc, 0, static_cast<std::size_t>(n) * sizeof(float), stream), "cudaMemsetAsync(dq sum)");
  switch (p.dtype) {
    case DType::bf16: launch_dtype<__nv_bfloat16>(p, stream); break;
    case DType::f16: launch_dtype<__half>(p, stream); break;
    default: launch_dtype<float>(p, stream); break;
  }
  if (n == 0) return;
  switch (p.dq_dtype) {
    case DType::bf16: dq_kernel<__nv_bfloat16><<<blocks_for(n), kThreads, 0, stream>>>(p); break;
    case DType::f16: dq_kernel<__half><<<blocks_for(n), kThreads, 0, stream>>>(p); break;
    default: dq_kernel<float><<<blocks_for(n), kThreads, 0, stream>>>(p); break;
  }
  check(cudaGetLastError(), "backward dq kernel launch");
}

}  // namespace attend::cuda
