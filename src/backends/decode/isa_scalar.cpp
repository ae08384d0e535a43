// The decode kernels compiled for scalar. Standard and project headers come first,
// outside the target region, so only the kernel code below is built for scalar
// and no shared inline function can leak wider instructions into other paths.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <utility>

#include "backends/decode/decode_params.h"
#include "backends/decode/dispatch.h"
#include "kernel/half.h"
#include "kernel/lse_merge.h"

// Order matters below: the ISA macros and SIMD wrapper come before the kernel bodies.
// clang-format off
#define ATTEND_DECODE_ISA isa_scalar
#define ATTEND_DECODE_SIMD ::attend::cpu::SimdScalar
#include "cpu/simd_scalar.h"
#include "backends/decode/decode_impl.h"
// clang-format on

namespace attend::decode {

KernelTable kernels_scalar() {
  using detail::bf16_t;
  using detail::f16_t;
  namespace k = isa_scalar;
  return {"scalar",
          {&k::split_task<float>, &k::combine_task<float>},
          {&k::split_task<bf16_t>, &k::combine_task<bf16_t>},
          {&k::split_task<f16_t>, &k::combine_task<f16_t>}};
}

}  // namespace attend::decode
