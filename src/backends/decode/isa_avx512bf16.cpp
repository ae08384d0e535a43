// The decode kernels of the avx512bf16 family: avx512's, except that bf16
// queries' scores and P V take vdpbf16ps (decode_impl.h's pair paths). Only the bf16
// kernels are compiled here; the f32 and f16 entries are avx512's.
//
// The Simd wrappers and decode's shared vector helpers are compiled in a
// plain AVX-512 region first, as in isa_avx512.cpp: their inline functions
// are not in this family's namespace and may be merged with that file's
// copies, so they must not carry the BF16 target. Only the kernel bodies,
// in namespace isa_avx512bf16, do.
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <utility>

#include "backends/decode/decode_params.h"
#include "backends/decode/dispatch.h"
#include "cpu/target_region.h"
#include "kernel/half.h"
#include "kernel/lse_merge.h"
#include "kernel/quant8.h"

ATTEND_AVX512_WARNINGS_BEGIN()
ATTEND_TARGET_REGION_BEGIN(ATTEND_FEATURES_AVX512)
// clang-format off
#include "cpu/simd_avx512.h"
#include "cpu/half_simd.h"
#include "backends/decode/decode_simd.h"
// clang-format on
ATTEND_TARGET_REGION_END()

ATTEND_TARGET_REGION_BEGIN(ATTEND_FEATURES_AVX512_BF16_AMX)
// clang-format off
#define ATTEND_DECODE_ISA isa_avx512bf16
#define ATTEND_DECODE_SIMD ::attend::cpu::SimdAvx512
#define ATTEND_DECODE_BF16_DOT 1
#include "backends/decode/decode_impl.h"
// clang-format on
ATTEND_TARGET_REGION_END()
ATTEND_AVX512_WARNINGS_END()

namespace attend::decode {

KernelTable kernels_avx512bf16() {
  KernelTable t = kernels_avx512();
  t.isa = "avx512bf16";
  t.bf16 = isa_avx512bf16::kernels_of<detail::bf16_t>();
  // bf16 queries over an 8-bit cache: scores on vdpbf16ps too (the codes as bf16).
  t.q8[1] = {isa_avx512bf16::kernels_of<detail::bf16_t, detail::fp8_e4m3_t>(),
             isa_avx512bf16::kernels_of<detail::bf16_t, detail::fp8_e5m2_t>(),
             isa_avx512bf16::kernels_of<detail::bf16_t, std::int8_t>()};
  return t;
}

}  // namespace attend::decode
