// The flash kernels compiled for avx2. Standard and project headers come first,
// outside the target region, so only the kernel code below is built for avx2
// and no shared inline function can leak wider instructions into other paths.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "backends/flash/dispatch.h"
#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2,f16c")

#define ATTEND_FLASH_ISA isa_avx2
#include "backends/flash/simd_avx2.h"
#include "backends/flash/gemm_tile.h"
#include "backends/flash/logits_tile.h"
#include "backends/flash/forward_impl.h"
#include "backends/flash/backward_impl.h"
#pragma GCC pop_options

namespace attend::flash {

KernelTable kernels_avx2() {
  return {"avx2", KernelTraits<SimdAvx2>::fwd_m, &isa_avx2::forward_block<SimdAvx2>,
          &isa_avx2::backward_head<SimdAvx2>, &forward_scratch_floats<SimdAvx2>, &backward_scratch_floats<SimdAvx2>};
}

}  // namespace attend::flash
