// The flash kernels compiled for scalar. Standard and project headers come first,
// outside the target region, so only the kernel code below is built for scalar
// and no shared inline function can leak wider instructions into other paths.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "backends/flash/dispatch.h"
#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"
#include "kernel/half.h"
#include "kernel/quant8.h"

// Order matters below: the ISA macros and SIMD wrapper come before the kernel bodies.
// clang-format off
#define ATTEND_FLASH_ISA isa_scalar
#include "cpu/simd_scalar.h"
#include "backends/flash/gemm_tile.h"
#include "backends/flash/logits_tile.h"
#include "backends/flash/forward_impl.h"
#include "backends/flash/backward_impl.h"
// clang-format on

namespace attend::flash {

KernelTable kernels_scalar() {
  using detail::bf16_t;
  using detail::f16_t;
  namespace k = isa_scalar;
  KernelTable t{"scalar",
                KernelTraits<SimdScalar>::fwd_m,
                {&k::forward_block<SimdScalar, float>, &k::backward_head<SimdScalar, float>,
                 &k::store_kv_parts<SimdScalar, float>},
                {&k::forward_block<SimdScalar, bf16_t>, &k::backward_head<SimdScalar, bf16_t>,
                 &k::store_kv_parts<SimdScalar, bf16_t>},
                {&k::forward_block<SimdScalar, f16_t>, &k::backward_head<SimdScalar, f16_t>,
                 &k::store_kv_parts<SimdScalar, f16_t>},
                &forward_scratch_floats<SimdScalar>,
                &backward_scratch_floats<SimdScalar>};
  t.q8 = k::q8_forward_kernels<SimdScalar>();
  return t;
}

}  // namespace attend::flash
