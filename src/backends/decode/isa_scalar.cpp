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
#include "kernel/quant8.h"

// Order matters below: the ISA macros and SIMD wrapper come before the kernel bodies.
// clang-format off
#define ATTEND_DECODE_ISA isa_scalar
#define ATTEND_DECODE_SIMD ::attend::cpu::SimdScalar
#include "cpu/simd_scalar.h"
#include "backends/decode/decode_impl.h"
// clang-format on

namespace attend::decode {

KernelTable kernels_scalar() { return isa_scalar::make_table("scalar"); }

}  // namespace attend::decode
