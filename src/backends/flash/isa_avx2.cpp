// The flash kernels compiled for avx2. Standard and project headers come first,
// outside the target region, so only the kernel code below is built for avx2
// and no shared inline function can leak wider instructions into other paths.
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "backends/flash/dispatch.h"
#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"
#include "cpu/target_region.h"
#include "kernel/half.h"
#include "kernel/quant8.h"

ATTEND_TARGET_REGION_BEGIN(ATTEND_FEATURES_AVX2)

// Order matters below: the ISA macros and SIMD wrapper come before the kernel bodies.
// clang-format off
#define ATTEND_FLASH_ISA isa_avx2
#include "cpu/simd_avx2.h"
#include "backends/flash/gemm_tile.h"
#include "backends/flash/logits_tile.h"
#include "backends/flash/forward_impl.h"
#include "backends/flash/backward_impl.h"
// clang-format on
ATTEND_TARGET_REGION_END()

namespace attend::flash {

KernelTable kernels_avx2() {
  using detail::bf16_t;
  using detail::f16_t;
  namespace k = isa_avx2;
  KernelTable t{
      "avx2",
      KernelTraits<SimdAvx2>::fwd_m,
      {&k::forward_block<SimdAvx2, float>, &k::backward_head<SimdAvx2, float>, &k::store_kv_parts<SimdAvx2, float>},
      {&k::forward_block<SimdAvx2, bf16_t>, &k::backward_head<SimdAvx2, bf16_t>, &k::store_kv_parts<SimdAvx2, bf16_t>},
      {&k::forward_block<SimdAvx2, f16_t>, &k::backward_head<SimdAvx2, f16_t>, &k::store_kv_parts<SimdAvx2, f16_t>},
      &forward_scratch_floats<SimdAvx2>,
      &backward_scratch_floats<SimdAvx2>};
  t.q8 = k::q8_forward_kernels<SimdAvx2>();
  return t;
}

}  // namespace attend::flash
