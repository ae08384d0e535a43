// The portable bf16/f16 converters (kernel/half.h): exact widening, round to
// nearest even when narrowing, NaN preserved, and bit-identical to the F16C
// instructions the SIMD kernels use.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernel/half.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace attend {
namespace {

using detail::bf16_bits_to_f32;
using detail::f16_bits_to_f32;
using detail::f32_to_bf16_bits;
using detail::f32_to_f16_bits;

bool is_nan_bits_f16(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool is_nan_bits_bf16(std::uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

TEST(Half, EveryBf16ValueRoundTripsThroughF32) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const std::uint16_t back = f32_to_bf16_bits(bf16_bits_to_f32(b));
    if (is_nan_bits_bf16(b)) {
      EXPECT_TRUE(is_nan_bits_bf16(back)) << std::hex << h;
    } else {
      EXPECT_EQ(back, b) << std::hex << h;
    }
  }
}

TEST(Half, EveryF16ValueRoundTripsThroughF32) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const std::uint16_t back = f32_to_f16_bits(f16_bits_to_f32(b));
    if (is_nan_bits_f16(b)) {
      EXPECT_TRUE(is_nan_bits_f16(back)) << std::hex << h;
    } else {
      EXPECT_EQ(back, b) << std::hex << h;
    }
  }
}

TEST(Half, Bf16NarrowingRoundsToNearestEvenAndKeepsNaN) {
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties go to the even (1).
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 0x1p-8f), 0x3f80u);
  // (1 + 2^-7) + 2^-8 is halfway between odd 1 + 2^-7 and 1 + 2^-6: up.
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82u);
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81u);          // above the tie: up
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80u);  // rounds to inf
  EXPECT_EQ(f32_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xff80u);
  // A NaN whose payload sits only in the low 16 bits must stay NaN (not become inf).
  EXPECT_TRUE(is_nan_bits_bf16(f32_to_bf16_bits(std::bit_cast<float>(0x7f800001u))));
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Half, F16NarrowingRoundsToNearestEvenWithSubnormalsAndOverflow) {
  EXPECT_EQ(f32_to_f16_bits(1.0f + 0x1p-11f), 0x3c00u);             // tie -> even
  EXPECT_EQ(f32_to_f16_bits(1.0f + 0x1p-10f + 0x1p-11f), 0x3c02u);  // tie -> even (up)
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7bffu);
  EXPECT_EQ(f32_to_f16_bits(65519.0f), 0x7bffu);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7c00u);  // tie at the top -> inf
  EXPECT_EQ(f32_to_f16_bits(0x1p-24f), 0x0001u);  // smallest subnormal
  EXPECT_EQ(f32_to_f16_bits(0x1p-25f), 0x0000u);  // tie -> even (0)
  EXPECT_EQ(f32_to_f16_bits(0x1p-25f + 0x1p-30f), 0x0001u);
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000u);
  EXPECT_EQ(f16_bits_to_f32(0x0001u), 0x1p-24f);
  EXPECT_TRUE(is_nan_bits_f16(f32_to_f16_bits(std::bit_cast<float>(0x7f800001u))));
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) std::uint16_t f16c_narrow(float f) {
  return static_cast<std::uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
__attribute__((target("f16c"))) float f16c_widen(std::uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

TEST(Half, PortableF16ConversionsMatchF16cBitForBit) {
  // cpuid, not __builtin_cpu_supports("f16c"): clang 14 (the sanitizer builds) rejects that name.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_F16C)) GTEST_SKIP() << "CPU without F16C";
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(f16c_widen(b)), std::bit_cast<std::uint32_t>(f16_bits_to_f32(b)))
        << std::hex << h;
  }
  // Every f32 exponent and sign, a prime stride through the mantissas (~4M values).
  int mismatches = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 1021) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(u));
    if (f16c_narrow(f) != f32_to_f16_bits(f) && ++mismatches < 10) {
      ADD_FAILURE() << std::hex << "f32 bits " << u << ": f16c " << f16c_narrow(f) << " portable "
                    << f32_to_f16_bits(f);
    }
  }
  EXPECT_EQ(mismatches, 0);
}
#endif

}  // namespace
}  // namespace attend
