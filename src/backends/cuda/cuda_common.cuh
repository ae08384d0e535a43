// Device code both passes share: element conversion, a query row's mask and
// ALiBi terms, the final logit of one (row, key) pair and the dropout factor,
// so forward and backward see exactly the same numbers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_params.h"

namespace attend::cuda {

using i64 = std::int64_t;

inline constexpr int kThreads = 256;  // one block: 16 x 16 threads over a tile

template <typename T>
__device__ inline float to_f32(T x);
template <>
__device__ inline float to_f32<float>(float x) {
  return x;
}
template <>
__device__ inline float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ inline float to_f32<__half>(__half x) {
  return __half2float(x);
}

// Round to nearest even, NaN kept: the CPU backends' rule (kernel/half.h).
template <typename T>
__device__ inline T from_f32(float x);
template <>
__device__ inline float from_f32<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ inline __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

// max that keeps a NaN (fmaxf drops it): a NaN logit poisons its row, as on the CPU.
__device__ inline float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

// Reduces over the 16 lanes that share a tile row (lane bits 0-3).
__device__ inline float row_max16(float x) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) x = nan_max(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ inline float row_sum16(float x) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// What the logits of one query row need: its visible keys, ALiBi slope and
// diagonal, and its bias row (null without bias).
template <typename T>
struct RowTerms {
  detail::KeyRange keys{0, 0};  // empty for a row past the sequence
  i64 diagonal = 0;
  float slope = 0.0f;
  const T* bias = nullptr;

  __device__ RowTerms(const CudaParams& p, i64 b, i64 h, i64 i, const detail::SeqSpan& s) {
    if (i >= s.q_len) return;
    keys = detail::visible_keys(p.mask, i, s.q_len, s.kv_len);
    diagonal = detail::diagonal(p.mask, i, s.q_len, s.kv_len);
    if (p.slopes.data) slope = p.slopes(b, h);
    if (p.bias && !keys.empty()) bias = static_cast<const T*>(p.bias) + p.sbias.offset(b, h, i);
  }

  // The logit of key j from q.k: scale, softcap, ALiBi, bias (every backend's
  // order), or -inf where masked. *dcap: d(logit)/d(scaled score), for backward.
  __device__ float logit(const CudaParams& p, float dot, i64 j, float* dcap) const {
    *dcap = 0.0f;
    if (j < keys.begin || j >= keys.end) return -INFINITY;
    float x = dot * p.scale;
    *dcap = 1.0f;
    if (p.softcap > 0.0f) {
      const float t = tanhf(x / p.softcap);
      x = p.softcap * t;
      *dcap = 1.0f - t * t;
    }
    if (p.slopes.data) x -= slope * static_cast<float>(diagonal > j ? diagonal - j : j - diagonal);
    if (bias) x += to_f32(bias[j]);
    return x;
  }
};

// Dropout's factor for (row i, key j) of sequence b, head h: 1/(1-p) kept,
// 0 dropped, drawn at the global position by the shared Philox function.
__device__ inline float dropout_factor(const CudaParams& p, i64 b, i64 h, i64 i, i64 j) {
  if (!p.dropout) return 1.0f;
  return p.dropout_mask.keep(b, h, p.mask.q_offset + i, p.mask.kv_offset + j) ? p.dropout_scale : 0.0f;
}

// Loads `n` (<= 4) consecutive elements of a row as f32, zeros past n.
template <typename T>
__device__ inline void load4(const T* row, int n, float (&x)[4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) x[c] = c < n ? to_f32(row[c]) : 0.0f;
}

// Index of query row i of sequence b among all rows (dense: b * seqlen_q + i;
// varlen: its packed row): the workspace's row order.
__device__ inline i64 row_index(const CudaParams& p, i64 b, const detail::SeqSpan& s, i64 i) {
  return p.varlen ? s.q_begin + i : b * p.seqlen_q + i;
}

// The kernels are compiled for head dims of 64, 128 and 256 columns (their
// accumulators' sizes); a head dim runs in the smallest that holds it.
inline int dim_bucket(i64 d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

// Calls f(std::integral_constant<int, B>{}) for d's bucket B.
template <class F>
void with_dim_bucket(i64 d, F&& f) {
  switch (dim_bucket(d)) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: return f(std::integral_constant<int, 256>{});
  }
}

// Launches `kernel(p)` on a grid of `grid` blocks of `threads` with `bytes` of
// dynamic shared memory (opted into first: above 48 KiB a kernel must ask).
template <class Kernel>
void launch_with_smem(Kernel kernel, const CudaParams& p, dim3 grid, int threads, std::size_t bytes,
                      cudaStream_t stream, const char* what) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what);
  kernel<<<grid, threads, bytes, stream>>>(p);
  check(cudaGetLastError(), what);
}

// The forward grids: one block per `rows_per_block` query rows, head and sequence.
inline dim3 query_block_grid(const CudaParams& p, int rows_per_block) {
  return {static_cast<unsigned>((p.seqlen_q + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(p.heads_q),
          static_cast<unsigned>(p.batch)};
}

}  // namespace attend::cuda
