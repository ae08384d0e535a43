// The flash backend: tiled online-softmax attention on the CPU (FlashAttention-2
// algorithm), forward and backward, SIMD kernels chosen at run time.
//
// Supports f32; head_dim_qk <= 256 and head_dim_v <= 512 in both passes (equal or
// different, any size); GQA/MQA, causal/window masks, softcap, ALiBi, additive
// bias (forward; no dbias), dropout (the shared Philox mask), varlen, strided
// inputs. Extra memory is per thread and independent of sequence length.
// Backward is bitwise identical across runs and thread counts.
// Environment: ATTEND_ISA=avx512|avx2|scalar forces a kernel family;
// ATTEND_NUM_THREADS caps its threads (else OpenMP's setting).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "attend/backend.h"

namespace attend {

inline constexpr std::int64_t kFlashMaxHeadDimQk = 256;
inline constexpr std::int64_t kFlashMaxHeadDimV = 512;

std::shared_ptr<const Backend> make_flash_backend();

// The kernel family flash runs with: "avx512", "avx2" or "scalar" (ATTEND_ISA, or
// the widest this CPU supports). Throws attend::Error if ATTEND_ISA is invalid.
std::string_view flash_active_isa();
// Whether this CPU can run the named kernel family.
bool flash_isa_supported(std::string_view isa);

}  // namespace attend
