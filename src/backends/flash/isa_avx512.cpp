// The flash kernels compiled for avx512. Standard and project headers come first,
// outside the target region, so only the kernel code below is built for avx512
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
// GCC 12 flags _mm512_reduce_*_ps (built on _mm512_undefined_ps) as maybe-uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,bmi,bmi2,f16c")

#define ATTEND_FLASH_ISA isa_avx512
#include "backends/flash/simd_avx512.h"
#include "backends/flash/gemm_tile.h"
#include "backends/flash/logits_tile.h"
#include "backends/flash/forward_impl.h"
#include "backends/flash/backward_impl.h"
#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace attend::flash {

KernelTable kernels_avx512() {
  return {"avx512", KernelTraits<SimdAvx512>::fwd_m, &isa_avx512::forward_block<SimdAvx512>,
          &isa_avx512::backward_head<SimdAvx512>, &forward_scratch_floats<SimdAvx512>, &backward_scratch_floats<SimdAvx512>};
}

}  // namespace attend::flash
