// The cuda backend: fused attention on NVIDIA GPUs (FlashAttention-2's
// algorithm on CUDA cores), forward and backward, on tensors in device memory.
// Built when CMake finds a CUDA compiler (ATTEND_CUDA=AUTO|ON|OFF; CMake's
// find_package(attend) sets attend_WITH_CUDA). Without a GPU at run time every
// check on a cuda device declines with the reason; the driver is asked only
// then, so a CPU-only process links it harmlessly.
//
// Supports f32, bf16 and f16 storage (f32 arithmetic, f32 LSE, results rounded
// once to the output dtype); forward head dims up to kCudaMaxHeadDimForward
// (equal or not: 192/128 inference), backward up to kCudaMaxHeadDimBackward
// (its tiles keep K, K^T, V^T and the dK/dV sums of 64 keys in one
// multiprocessor's shared memory and registers); GQA/MQA, causal/window masks
// with the partial problem's offsets, softcap, ALiBi, additive bias (no dbias),
// dropout (the shared Philox mask, bit-identical to the CPU backends'), varlen
// (cu_seqlens are copied to the host and checked by the runtime's rules before
// the kernels, with one stream synchronisation), any strides with a contiguous head dim, accumulate_grads
// and an f32 dq. Not yet: paged K/V, attention sinks, an f32 out for half
// inputs, a deterministic backward (dQ is summed with atomics), and the
// non-finite rule (docs/design.md): masked pairs' zero weights meet their
// NaN/inf values here. Two variants: "mma" (the bf16/f16 forward on tensor
// cores, no backward) and "simt" (every dtype, both passes, CUDA cores).
//
// Work is queued on ForwardArgs::stream / BackwardArgs::stream (a cudaStream_t;
// null: the default stream) and the call returns before it finishes, as CUDA
// libraries do. Workspace (backward: an f32 dQ sum and one float per query row
// and head) must be device memory: pass a Workspace, or call through a Plan or
// attend::forward/backward with CallOptions::allocator = &cuda_allocator().
#pragma once

#include <cstdint>
#include <memory>

#include "attend/backend.h"
#include "attend/device.h"

namespace attend {

inline constexpr std::int64_t kCudaMaxHeadDimForward = 256;
inline constexpr std::int64_t kCudaMaxHeadDimBackward = 128;

std::shared_ptr<const Backend> make_cuda_backend();

// Device memory from cudaMalloc on the device a call names (cuda:N); host
// memory (Device::cpu()) is an attend::Error. Freed with cudaFree, which
// synchronises the device: hold outputs and workspace across calls (a Plan
// with caller-provided tensors) in a training loop.
Allocator& cuda_allocator();

// GPUs the CUDA runtime reports in this process (0 without a driver or GPU).
int cuda_device_count();

}  // namespace attend
