// The decode kernels compiled for avx512. Standard and project headers come first,
// outside the target region, so only the kernel code below is built for avx512
// and no shared inline function can leak wider instructions into other paths.
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <utility>

#include "backends/decode/decode_params.h"
#include "backends/decode/dispatch.h"
#include "cpu/target_region.h"
#include "kernel/half.h"
#include "kernel/lse_merge.h"
#include "kernel/quant8.h"

ATTEND_AVX512_WARNINGS_BEGIN()
ATTEND_TARGET_REGION_BEGIN(ATTEND_FEATURES_AVX512)

// Order matters below: the ISA macros and SIMD wrapper come before the kernel bodies.
// clang-format off
#define ATTEND_DECODE_ISA isa_avx512
#define ATTEND_DECODE_SIMD ::attend::cpu::SimdAvx512
#include "cpu/simd_avx512.h"
#include "backends/decode/decode_impl.h"
// clang-format on
ATTEND_TARGET_REGION_END()
ATTEND_AVX512_WARNINGS_END()

namespace attend::decode {

KernelTable kernels_avx512() { return isa_avx512::make_table("avx512"); }

}  // namespace attend::decode
