// One table of kernels per ISA, chosen once at run time (CPU features, or
// ATTEND_ISA=avx512amx|avx512bf16|avx512|avx2|scalar to force a path — forcing one the CPU lacks is
// an attend::Error, never an illegal instruction).
#pragma once

#include <cstdint>
#include <string_view>

#include "backends/flash/flash_params.h"

namespace attend::flash {

// The kernels of one element type (of q/k/v/out and the gradients; tiles are f32).
struct DtypeKernels {
  // Forward of query block qb of (batch b, query head h).
  void (*forward_block)(const FlashParams&, std::int64_t b, std::int64_t h, std::int64_t qb, float* scratch) = nullptr;
  // Backward of (batch b, kv head hk) and its whole GQA group.
  void (*backward_head)(const FlashParams&, std::int64_t b, std::int64_t hk, float* scratch) = nullptr;
  // Floats per thread these kernels need beyond the table's forward_scratch /
  // backward_scratch (and the bf16/f16 dQ sum); null: none.
  std::int64_t (*forward_extra)(std::int64_t dqk, std::int64_t dv) = nullptr;
  std::int64_t (*backward_extra)(std::int64_t dqk, std::int64_t dv) = nullptr;
  // The instructions a half dtype's GEMMs run on (e.g. "AMX-BF16 tiles"); null:
  // it is widened to f32 as tiles are packed and runs at the f32 kernels' speed.
  // flash's check() reports it (Support::notes).
  const char* half_gemms = nullptr;
};

struct KernelTable {
  std::string_view isa;
  std::int64_t block_m = 0;  // query rows per forward task
  DtypeKernels f32, bf16, f16;
  std::int64_t (*forward_scratch)(std::int64_t dqk, std::int64_t dv) = nullptr;   // floats per thread
  std::int64_t (*backward_scratch)(std::int64_t dqk, std::int64_t dv) = nullptr;  // floats per thread
  const DtypeKernels& for_dtype(DType dtype) const {
    return dtype == DType::bf16 ? bf16 : dtype == DType::f16 ? f16 : f32;
  }
};

KernelTable kernels_scalar();
KernelTable kernels_avx2();
KernelTable kernels_avx512();
// avx512 plus AVX512-BF16: the bf16 forward and backward run on vdpbf16ps
// (forward_bf16_impl.h, backward_bf16_impl.h).
KernelTable kernels_avx512bf16();
// avx512bf16 plus AMX-BF16: the bf16 forward and backward run on AMX tiles.
KernelTable kernels_avx512amx();

// The table for ATTEND_ISA if set, else the widest the CPU supports.
const KernelTable& active_kernels();
// The table for a named ISA; throws attend::Error if unknown or not supported here.
const KernelTable& kernels_for(std::string_view isa);
bool cpu_supports(std::string_view isa);

}  // namespace attend::flash
