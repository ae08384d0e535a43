// The tile units of src/cpu/amx_tiles.h. The emulated TDPBF16PS is checked
// against hand-derived answers that tell the hardware's order of additions from
// the SDM pseudo-code's, against a scalar model of that order written here
// independently (random tiles over the whole exponent range), and, on a CPU
// with AMX, bit for bit against the hardware. Loads, stores and zeroing keep
// every byte where the hardware would.
#include <immintrin.h>

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "cpu/isa.h"
#include "cpu/target_region.h"

namespace {

// One TDPBF16PS on tiles given in memory: C (16 x 16 f32) += A (16 x 32 bf16) . B
// (16 pair rows x 16 columns of bf16 pairs).
struct DotTiles {
  std::uint16_t a[16][32];
  std::uint32_t b[16][16];
  float c[16][16];
};

}  // namespace

ATTEND_AVX512_WARNINGS_BEGIN()
ATTEND_TARGET_REGION_BEGIN(ATTEND_FEATURES_AVX512_BF16_AMX)
#include "cpu/amx_tiles.h"
namespace {
template <class Unit>
void dot_on(DotTiles& t) {
  Unit::configure();
  Unit::template load<5>(t.a, 64);
  Unit::template load<7>(t.b, 64);
  Unit::template load<2>(t.c, 64);
  Unit::template dpbf16ps<2, 5, 7>();
  Unit::template store<2>(t.c, 64);
  Unit::release();
}
void dot_emulated(DotTiles& t) { dot_on<attend::cpu::AmxTilesEmulated>(t); }
void dot_native(DotTiles& t) { dot_on<attend::cpu::AmxTiles>(t); }

// Loads 16 rows `stride` bytes apart, zeroes another tile, stores both.
template <class Unit>
void move_on(const char* src, std::int64_t stride, char* dst, char* zeros) {
  Unit::configure();
  Unit::template load<3>(src, stride);
  Unit::template zero<4>();
  Unit::template store<3>(dst, 64);
  Unit::template store<4>(zeros, 64);
  Unit::release();
}
void move_emulated(const char* src, std::int64_t stride, char* dst, char* zeros) {
  move_on<attend::cpu::AmxTilesEmulated>(src, stride, dst, zeros);
}
}  // namespace
ATTEND_TARGET_REGION_END()
ATTEND_AVX512_WARNINGS_END()

namespace {

using attend::cpu::Isa;

constexpr std::uint16_t bf16(float x) { return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16); }
constexpr std::uint32_t pair(std::uint16_t even, std::uint16_t odd) {
  return static_cast<std::uint32_t>(even) | static_cast<std::uint32_t>(odd) << 16;
}
std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

// The model, scalar: a denormal (f32 or bf16 read as f32) becomes a signed zero.
float flushed(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
float widen(std::uint16_t h) { return flushed(std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16)); }

// Even and odd products in two sums from zero, each step rounded and flushed,
// then C + (even + odd). Baseline x86-64 code: no FMA to contract into.
void dot_model(DotTiles& t) {
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      float even = 0.0f, odd = 0.0f;
      for (int k = 0; k < 16; ++k) {
        const float pe = widen(t.a[m][2 * k]) * widen(static_cast<std::uint16_t>(t.b[k][n]));
        even = flushed(even + pe);
        const float po = widen(t.a[m][2 * k + 1]) * widen(static_cast<std::uint16_t>(t.b[k][n] >> 16));
        odd = flushed(odd + po);
      }
      const float both = flushed(even + odd);
      t.c[m][n] = flushed(t.c[m][n] + both);
    }
  }
}

DotTiles zero_tiles() {
  DotTiles t;
  std::memset(&t, 0, sizeof t);
  return t;
}

class AmxTiles : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!attend::cpu::supports(Isa::avx512bf16)) GTEST_SKIP() << "the emulated tiles run on AVX512-BF16";
  }
};

// Even lane: +1 (k=0) then -1 (k=1); odd lane: 2^-30 (k=0). The hardware's two
// sums give 2^-30; the SDM order (one sum, even then odd per k) loses it to 1.
TEST_F(AmxTiles, EvenAndOddProductsSumInSeparateLanes) {
  DotTiles t = zero_tiles();
  t.a[0][0] = bf16(1.0f);
  t.a[0][1] = bf16(std::ldexp(1.0f, -30));
  t.a[0][2] = bf16(-1.0f);
  t.b[0][0] = pair(bf16(1.0f), bf16(1.0f));
  t.b[1][0] = pair(bf16(1.0f), bf16(1.0f));
  dot_emulated(t);
  EXPECT_EQ(t.c[0][0], std::ldexp(1.0f, -30));
  EXPECT_EQ(t.c[0][1], 0.0f);
  EXPECT_EQ(t.c[1][0], 0.0f);
}

// C + (even + odd), not (C + even) + odd: 1 + (2^-24 + 2^-24) is 1 + 2^-23, while
// adding each 2^-24 to 1 on its own rounds (to even) back to 1 twice.
TEST_F(AmxTiles, CIsAddedToTheSumOfBothLanes) {
  DotTiles t = zero_tiles();
  t.c[3][5] = 1.0f;
  t.a[3][0] = bf16(std::ldexp(1.0f, -24));
  t.a[3][1] = bf16(std::ldexp(1.0f, -24));
  t.b[0][5] = pair(bf16(1.0f), bf16(1.0f));
  dot_emulated(t);
  EXPECT_EQ(t.c[3][5], 1.0f + std::ldexp(1.0f, -23));
}

// A bf16 denormal input reads as zero (else 2^-133 x 2^100 = 2^-33), and a
// denormal f32 result is flushed (-2^-70 x 2^-70 = -2^-140) keeping its sign:
// at the last pair (k = 15), both lanes end at -0, and -0 + -0 and C = -0 plus
// that stay -0 (a +0 product after it, or a +0 lane, would make the result +0).
TEST_F(AmxTiles, DenormalInputsAndResultsAreSignedZeros) {
  DotTiles t = zero_tiles();
  t.a[0][0] = 0x0001;  // 2^-133
  t.b[0][0] = pair(bf16(std::ldexp(1.0f, 100)), 0);
  t.a[1][30] = bf16(-std::ldexp(1.0f, -70));
  t.a[1][31] = bf16(-std::ldexp(1.0f, -70));
  t.b[15][1] = pair(bf16(std::ldexp(1.0f, -70)), bf16(std::ldexp(1.0f, -70)));
  t.c[1][1] = -0.0f;
  dot_emulated(t);
  EXPECT_EQ(bits(t.c[0][0]), 0u);
  EXPECT_EQ(bits(t.c[1][1]), 0x80000000u) << t.c[1][1];
}

// Random tiles: in "wild" rounds any bit pattern (denormals, overflow to inf,
// NaN from inf - inf), otherwise values of |x| in about [2^-31, 2^32] and
// either sign, whose sums cancel; C normal, or any bits when wild.
DotTiles random_tiles(std::mt19937& rng, bool wild) {
  std::uniform_int_distribution<int> any16(0, 0xffff);
  std::uniform_int_distribution<int> mid(0x3000, 0x4fff);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto draw = [&] {
    if (wild) return static_cast<std::uint16_t>(any16(rng));
    const auto h = static_cast<std::uint16_t>(mid(rng));
    return static_cast<std::uint16_t>(rng() & 1 ? h | 0x8000 : h);
  };
  DotTiles t;
  for (auto& row : t.a)
    for (auto& x : row) x = draw();
  for (auto& row : t.b)
    for (auto& x : row) x = pair(draw(), draw());
  for (auto& row : t.c)
    for (auto& x : row) x = wild ? std::bit_cast<float>(static_cast<std::uint32_t>(rng())) : normal(rng);
  return t;
}

// Every C element bit for bit (a NaN's payload aside: any NaN matches any NaN).
void expect_same_c(const DotTiles& got, const DotTiles& want, int round, const char* want_name) {
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      const bool both_nan = std::isnan(got.c[m][n]) && std::isnan(want.c[m][n]);
      ASSERT_TRUE(both_nan || bits(got.c[m][n]) == bits(want.c[m][n]))
          << "round " << round << " C[" << m << "][" << n << "] = " << got.c[m][n] << ", " << want_name << " "
          << want.c[m][n];
    }
  }
}

// The vector emulation equals the scalar model bit for bit.
TEST_F(AmxTiles, EmulationEqualsTheScalarModelOnRandomTiles) {
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    DotTiles t = random_tiles(rng, round % 3 == 0);
    DotTiles expect = t;
    dot_model(expect);
    dot_emulated(t);
    expect_same_c(t, expect, round, "model");
  }
}

TEST_F(AmxTiles, LoadsHonourTheStrideAndZeroClearsATile) {
  std::vector<char> src(16 * 200);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 1);
  char dst[16 * 64], zeros[16 * 64];
  std::memset(zeros, 0x5a, sizeof zeros);
  move_emulated(src.data(), 200, dst, zeros);
  for (int r = 0; r < 16; ++r) {
    ASSERT_EQ(std::memcmp(dst + r * 64, src.data() + r * 200, 64), 0) << "row " << r;
  }
  for (char z : zeros) ASSERT_EQ(z, 0);
}

// Where the CPU has AMX: the hardware and the emulation agree on every bit.
TEST(AmxTilesNative, EmulationIsBitIdenticalToTheHardware) {
  if (!attend::cpu::supports(Isa::avx512amx)) GTEST_SKIP() << "this CPU or OS does not allow AMX-BF16 tiles";
  std::mt19937 rng(11);
  for (int round = 0; round < 2000; ++round) {
    DotTiles t = random_tiles(rng, round % 4 == 0);
    DotTiles native = t;
    dot_native(native);
    dot_emulated(t);
    expect_same_c(t, native, round, "hardware");
  }
}

}  // namespace
