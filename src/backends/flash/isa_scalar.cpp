// The flash kernels compiled for scalar. Standard and project headers come first,
// outside the target region, so only the kernel code below is built for scalar
// and no shared inline function can leak wider instructions into other paths.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "backends/flash/dispatch.h"
#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"

#define ATTEND_FLASH_ISA isa_scalar
#include "backends/flash/simd_scalar.h"
#include "backends/flash/gemm_tile.h"
#include "backends/flash/logits_tile.h"
#include "backends/flash/forward_impl.h"
#include "backends/flash/backward_impl.h"

namespace attend::flash {

KernelTable kernels_scalar() {
  return {"scalar", KernelTraits<SimdScalar>::fwd_m, &isa_scalar::forward_block<SimdScalar>,
          &isa_scalar::backward_head<SimdScalar>, &forward_scratch_floats<SimdScalar>, &backward_scratch_floats<SimdScalar>};
}

}  // namespace attend::flash
