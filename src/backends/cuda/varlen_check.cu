// The cu_seqlens rules of validate_contents (runtime/validate_inputs.cpp),
// evaluated where the arrays live. The runtime never reads device memory, and
// the kernels index K/V and the workspace through these arrays, so they run
// only after this check came back clean.
#include "backends/cuda/cuda_common.cuh"

namespace attend::cuda {
namespace {

__device__ bool check_one(const std::int32_t* cu, i64 stride, i64 batch, i64 total, i64 max_len, std::int32_t which,
                          VarlenFault* f) {
  auto fault = [&](i64 index, std::int32_t rule) {
    *f = {which, static_cast<std::int32_t>(index), cu[index * stride], rule};
    return false;
  };
  if (cu[0] != 0) return fault(0, 1);
  for (i64 b = 0; b < batch; ++b) {
    const i64 len = static_cast<i64>(cu[(b + 1) * stride]) - cu[b * stride];
    if (len < 0) return fault(b + 1, 2);
    if (len > max_len) return fault(b + 1, 4);
  }
  if (cu[batch * stride] > total) return fault(batch, 3);
  return true;
}

// One thread: B + 1 entries per array, a few microseconds against the kernels.
__global__ void varlen_check_kernel(const CudaParams p, VarlenFault* f) {
  *f = {};
  if (check_one(p.seqs.cu_q, p.seqs.cu_q_stride, p.batch, p.total_q, p.seqlen_q, 1, f)) {
    check_one(p.seqs.cu_kv, p.seqs.cu_kv_stride, p.batch, p.total_kv, p.seqlen_kv, 2, f);
  }
}

}  // namespace

void launch_varlen_check(const CudaParams& p, VarlenFault* fault, cudaStream_t stream) {
  varlen_check_kernel<<<1, 1, 0, stream>>>(p, fault);
  check(cudaGetLastError(), "varlen check kernel launch");
}

}  // namespace attend::cuda
