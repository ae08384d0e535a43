// One table of kernels per ISA, chosen once at run time (CPU features, or
// ATTEND_ISA=avx512|avx2|scalar to force a path — forcing one the CPU lacks is
// an attend::Error, never an illegal instruction).
#pragma once

#include <cstdint>
#include <string_view>

#include "backends/flash/flash_params.h"

namespace attend::flash {

struct KernelTable {
  std::string_view isa;
  std::int64_t block_m = 0;  // query rows per forward task
  // Forward of query block qb of (batch b, query head h).
  void (*forward_block)(const FlashParams&, std::int64_t b, std::int64_t h, std::int64_t qb, float* scratch) = nullptr;
  // Backward of (batch b, kv head hk) and its whole GQA group.
  void (*backward_head)(const FlashParams&, std::int64_t b, std::int64_t hk, float* scratch) = nullptr;
  std::int64_t (*forward_scratch)(std::int64_t dqk, std::int64_t dv) = nullptr;   // floats per thread
  std::int64_t (*backward_scratch)(std::int64_t dqk, std::int64_t dv) = nullptr;  // floats per thread
};

KernelTable kernels_scalar();
KernelTable kernels_avx2();
KernelTable kernels_avx512();

// The table for ATTEND_ISA if set, else the widest the CPU supports.
const KernelTable& active_kernels();
// The table for a named ISA; throws attend::Error if unknown or not supported here.
const KernelTable& kernels_for(std::string_view isa);
bool cpu_supports(std::string_view isa);

}  // namespace attend::flash
