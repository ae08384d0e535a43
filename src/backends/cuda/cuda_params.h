// The cuda backend's kernel parameters: KernelProblem (sizes, logit terms,
// masks, tensors and strides, the dropout mask: what every fused kernel
// derives the same way) plus the outputs, gradients and workspace pointers.
// Plain values and device pointers, passed to the kernels by value.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernel/kernel_problem.h"

namespace attend::cuda {

struct CudaParams : detail::KernelProblem {
  void* out = nullptr;  // forward: written; backward: read
  detail::TokenStrides so;
  float* lse = nullptr;  // (B,H,Sq) or (H,total_q), f32
  detail::TokenStrides slse;

  // backward
  const void* dout = nullptr;
  detail::TokenStrides sdo;
  void *grad_q = nullptr, *grad_k = nullptr, *grad_v = nullptr;  // dq, dk, dv
  detail::TokenStrides sgq, sgk, sgv;
  DType dq_dtype = DType::f32;
  bool accumulate = false;  // add into dq/dk/dv instead of overwriting them
  // Workspace: the f32 dQ sum (rows x heads_q x dqk) and D_i = dO_i . O_i
  // (heads_q x rows), where a query row's index is b * seqlen_q + i, or its
  // packed row for varlen.
  float* dq_acc = nullptr;
  float* delta = nullptr;

  bool varlen = false;
  std::int64_t rows = 0;                   // query rows of all sequences (B*Sq, or total_q)
  std::int64_t total_q = 0, total_kv = 0;  // varlen: the packed tensors' extents
};

// Each queues its kernels on `stream` and throws attend::Error when a launch fails.
void launch_forward(const CudaParams& p, cudaStream_t stream);
void launch_forward_mma(const CudaParams& p, cudaStream_t stream);  // bf16/f16 on tensor cores
void launch_backward(const CudaParams& p, cudaStream_t stream);

// Dynamic shared memory the kernels ask for, in bytes (the check compares it
// with the device's opt-in limit).
std::size_t forward_smem_bytes(std::int64_t dqk, std::int64_t dv);
std::size_t forward_mma_smem_bytes(std::int64_t dqk, std::int64_t dv);
std::size_t backward_smem_bytes(std::int64_t dqk, std::int64_t dv);

// Throws attend::Error naming `what` when `status` is an error: out_of_memory
// for an allocation failure, bad_state for anything else.
void check(cudaError_t status, const char* what);

}  // namespace attend::cuda
