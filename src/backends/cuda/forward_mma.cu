// Forward on tensor cores for bf16/f16 (the "mma" variant): FlashAttention-2's
// loop with both products on mma.sync.m16n8k16 (half inputs, f32 accumulators).
// A block of 4 warps owns 64 query rows of one (sequence, head); each warp
// keeps 16 rows' scores, running max and sum, and O in the mma accumulator
// layout. The score accumulators of two adjacent 8-key blocks are exactly the
// A operand of the next product (P V) once rounded to the input type, so P
// never goes through shared memory. Q, K and V sit row-major with 8 extra
// elements per row: the fragments' loads (ldmatrix for V) hit distinct banks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/cuda/cuda_common.cuh"

namespace attend::cuda {
namespace {

constexpr int kWarps = 4, kMmaThreads = 32 * kWarps;
constexpr int kBM = 16 * kWarps, kBN = 64;

i64 pad16(i64 n) { return (n + 15) / 16 * 16; }

// Elements: Q [64][qp], K [64][qp], V [64][DVM + 8]. The pitches keep rows
// 16-byte aligned (vector stores, ldmatrix) and 4 banks apart.
std::size_t smem_elems(i64 dqk, int dvm) {
  const i64 qp = pad16(dqk) + 8;
  return static_cast<std::size_t>(2 * kBM * qp + kBN * (dvm + 8));
}

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  __device__ static void run(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static std::uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
};
template <>
struct Mma<__half> {
  __device__ static void run(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static std::uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
};

// Two consecutive elements as one 32-bit register (the fragments' pairs).
template <typename T>
__device__ inline std::uint32_t pair(const T* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}
// V's B fragments for two 8-column blocks at once: the four 8x8 blocks (keys
// k0.., k0+8..) x (columns n0.., n0+8..) of the row-major tile, transposed by
// ldmatrix so that each thread holds (key 2 tig + {0,1}, column gid) pairs.
__device__ inline void v_fragments(const void* tile, int pitch, int lane, std::uint32_t (&r)[4]) {
  const int m = lane >> 3, row = lane & 7;
  const auto* base = static_cast<const std::uint16_t*>(tile) + ((m & 1) * 8 + row) * pitch + (m >> 1) * 8;
  const auto addr = static_cast<unsigned>(__cvta_generic_to_shared(base));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Whether a token tensor's rows can be read 16 bytes (8 elements) at a time.
__device__ inline bool vector_rows(const void* base, const detail::TokenStrides& st, i64 dim) {
  return dim % 8 == 0 && reinterpret_cast<std::uintptr_t>(base) % 16 == 0 && st.b % 8 == 0 && st.s % 8 == 0 &&
         st.h % 8 == 0;
}

// Copies rows [token0, token0 + rows) x dims [0, dim) of a token tensor into
// a 64-row tile of `width` columns, zeros past rows and dim.
template <typename T>
__device__ inline void load_rows(T* tile, int pitch, int width, const T* base, const detail::TokenStrides& st, i64 b,
                                 i64 token0, i64 head, int rows, i64 dim, bool vec) {
  if (vec) {
    const int chunks = width / 8;
    for (int idx = static_cast<int>(threadIdx.x); idx < kBN * chunks; idx += kMmaThreads) {
      const int r = idx / chunks, d = idx % chunks * 8;
      uint4 x = make_uint4(0, 0, 0, 0);
      if (r < rows && d < dim) x = *reinterpret_cast<const uint4*>(base + st.offset(b, token0 + r, head) + d);
      *reinterpret_cast<uint4*>(tile + r * pitch + d) = x;
    }
    return;
  }
  for (int idx = static_cast<int>(threadIdx.x); idx < kBN * width; idx += kMmaThreads) {
    const int r = idx / width, d = idx % width;
    T x = from_f32<T>(0.0f);
    if (r < rows && d < dim) x = base[st.offset(b, token0 + r, head) + d];
    tile[r * pitch + d] = x;
  }
}

template <typename T, int DVM>
__global__ void __launch_bounds__(kMmaThreads) forward_mma_kernel(const CudaParams p) {
  constexpr int NV = DVM / 8;  // O's 8-column blocks
  extern __shared__ float4 smem4[];
  T* smem = reinterpret_cast<T*>(smem4);
  const int dq16 = static_cast<int>((p.dqk + 15) / 16 * 16), qp = dq16 + 8, vp = DVM + 8;
  T* Qs = smem;
  T* Ks = Qs + kBM * qp;
  T* Vs = Ks + kBN * qp;

  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int gid = lane >> 2, tig = lane & 3;
  const i64 b = blockIdx.z, h = blockIdx.y, i0 = static_cast<i64>(blockIdx.x) * kBM;
  const detail::SeqSpan s = p.seqs(b);
  if (i0 >= s.q_len) return;  // the whole block: before any barrier
  const i64 hk = h / p.group;
  const int rows = static_cast<int>(min(static_cast<i64>(kBM), s.q_len - i0));
  const bool vq = vector_rows(p.q, p.sq, p.dqk), vk = vector_rows(p.k, p.sk, p.dqk), vv = vector_rows(p.v, p.sv, p.dv);
  load_rows(Qs, qp, dq16, static_cast<const T*>(p.q), p.sq, b, s.q_begin + i0, h, rows, p.dqk, vq);

  // This thread's two rows: gid and gid + 8 of its warp's 16.
  const int r0 = warp * 16 + gid;
  const RowTerms<T> terms[2] = {RowTerms<T>(p, b, h, i0 + r0, s), RowTerms<T>(p, b, h, i0 + r0 + 8, s)};
  const i64 j_begin = detail::visible_keys(p.mask, i0, s.q_len, s.kv_len).begin;
  const i64 j_end = detail::visible_keys(p.mask, i0 + rows - 1, s.q_len, s.kv_len).end;

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[NV][4];
#pragma unroll
  for (int n = 0; n < NV; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (i64 j0 = j_begin; j0 < j_end; j0 += kBN) {
    const int cols = static_cast<int>(min(static_cast<i64>(kBN), j_end - j0));
    __syncthreads();  // Q is stored (first tile); the previous K and V are consumed
    load_rows(Ks, qp, dq16, static_cast<const T*>(p.k), p.sk, b, s.kv_begin + j0, hk, cols, p.dqk, vk);
    load_rows(Vs, vp, DVM, static_cast<const T*>(p.v), p.sv, b, s.kv_begin + j0, hk, cols, p.dv, vv);
    __syncthreads();

    // S = Q K^T: 16 rows x 64 keys per warp, eight 8-key accumulator blocks.
    float sc[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
    for (int kk = 0; kk < dq16; kk += 16) {
      const T* qa = Qs + r0 * qp + kk + tig * 2;
      const std::uint32_t a[4] = {pair(qa), pair(qa + 8 * qp), pair(qa + 8), pair(qa + 8 * qp + 8)};
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const T* kb = Ks + (n * 8 + gid) * qp + kk + tig * 2;
        Mma<T>::run(sc[n], a, pair(kb), pair(kb + 8));
      }
    }

    // Logits and the online softmax, per row (accumulator elements 0-1: row
    // gid, 2-3: row gid + 8; key n * 8 + 2 tig + e).
    std::uint32_t pa[4][4];  // P as the A operand of four 16-key steps
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const i64 i = i0 + r0 + 8 * half;
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float dcap;
          float& x = sc[n][2 * half + e];
          x = terms[half].logit(p, x, j0 + n * 8 + tig * 2 + e, &dcap);
          mx = nan_max(mx, x);
        }
      mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = nan_max(m[half], mx);
      const float base = m_new == -INFINITY ? 0.0f : m_new;
      const float corr = expf(m[half] - base);
      float rs = 0.0f;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[n][2 * half + e];
          x = expf(x - base);
          rs += x;
          if (p.dropout) x *= dropout_factor(p, b, h, i, j0 + n * 8 + tig * 2 + e);
        }
      rs += __shfl_xor_sync(0xffffffffu, rs, 1);
      rs += __shfl_xor_sync(0xffffffffu, rs, 2);
      l[half] = l[half] * corr + rs;
      m[half] = m_new;
#pragma unroll
      for (int n = 0; n < NV; ++n) {
        o[n][2 * half] *= corr;
        o[n][2 * half + 1] *= corr;
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        pa[k][half] = Mma<T>::pack(sc[2 * k][2 * half], sc[2 * k][2 * half + 1]);
        pa[k][2 + half] = Mma<T>::pack(sc[2 * k + 1][2 * half], sc[2 * k + 1][2 * half + 1]);
      }
    }

    // O += P V over the tile's keys (zero rows past `cols`).
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int n = 0; n < NV; n += 2) {
        std::uint32_t vf[4];
        v_fragments(Vs + k * 16 * vp + n * 8, vp, lane, vf);
        Mma<T>::run(o[n], pa[k], vf[0], vf[1]);
        Mma<T>::run(o[n + 1], pa[k], vf[2], vf[3]);
      }
    }
  }

  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + 8 * half;
    if (r >= rows) continue;
    const i64 i = i0 + r;
    const float inv = l[half] == 0.0f ? 0.0f : 1.0f / l[half];
    T* orow = out + p.so.offset(b, s.q_begin + i, h);
#pragma unroll
    for (int n = 0; n < NV; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = n * 8 + tig * 2 + e;
        if (col < p.dv) orow[col] = from_f32<T>(o[n][2 * half + e] * inv);
      }
    if (tig == 0) p.lse[p.slse.offset(b, s.q_begin + i, h)] = l[half] == 0.0f ? -INFINITY : m[half] + logf(l[half]);
  }
}

template <typename T, int DVM>
void launch(const CudaParams& p, cudaStream_t stream) {
  launch_with_smem(forward_mma_kernel<T, DVM>, p, query_block_grid(p, kBM), kMmaThreads,
                   smem_elems(p.dqk, DVM) * sizeof(T), stream, "forward (mma) launch");
}

template <typename T>
void launch_dtype(const CudaParams& p, cudaStream_t stream) {
  with_dim_bucket(p.dv, [&](auto dvm) { launch<T, decltype(dvm)::value>(p, stream); });
}

}  // namespace

std::size_t forward_mma_smem_bytes(std::int64_t dqk, std::int64_t dv) { return smem_elems(dqk, dim_bucket(dv)) * 2; }

void launch_forward_mma(const CudaParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0) return;
  if (p.dtype == DType::f16) return launch_dtype<__half>(p, stream);
  launch_dtype<__nv_bfloat16>(p, stream);
}

}  // namespace attend::cuda
