// The 8-bit K/V conversions of kernel/quant8.h against independent definitions:
// every code's value from the OCP formulas in double, and every encoding
// against a brute-force search for the nearest code (ties to the even code),
// with saturation at the largest finite code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "kernel/quant8.h"

namespace attend::detail {
namespace {

// (-1)^s 2^(e - bias) (1 + m / 2^mbits), subnormals 2^(1 - bias) m / 2^mbits.
double ocp_value(std::uint8_t code, int mbits, int bias) {
  const int e = (code & 0x7f) >> mbits, m = code & ((1 << mbits) - 1);
  const double mag = e == 0 ? std::ldexp(m, 1 - bias - mbits) : std::ldexp(1.0 + std::ldexp(m, -mbits), e - bias);
  return (code & 0x80) ? -mag : mag;
}

TEST(Quant8, E4m3DecodesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float x = fp8_e4m3_bits_to_f32(code);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(x)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(x), ocp_value(code, 3, 7)) << c;
    }
  }
  EXPECT_EQ(fp8_e4m3_bits_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_bits_to_f32(0x01), 0x1p-9f);
}

TEST(Quant8, E5m2DecodesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float x = fp8_e5m2_bits_to_f32(code);
    const int e = (c & 0x7f) >> 2;
    if (e == 31) {
      EXPECT_TRUE((c & 3) ? std::isnan(x) : std::isinf(x)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(x), ocp_value(code, 2, 15)) << c;
    }
  }
  EXPECT_EQ(fp8_e5m2_bits_to_f32(0x7b), 57344.0f);
}

// The nearest finite code by search; a tie goes to the even code; beyond the
// largest code, that code (saturation).
std::uint8_t nearest(float x, float (*decode)(std::uint8_t), int top) {
  std::uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= top; ++c) {
    for (int sign : {0, 0x80}) {
      const auto code = static_cast<std::uint8_t>(c | sign);
      const double err = std::fabs(static_cast<double>(decode(code)) - x);
      if (err < best_err || (err == best_err && (code & 1) == 0 && (best & 1) == 1)) {
        best = code;
        best_err = err;
      }
    }
  }
  // ±0: the sign of x (the search cannot tell them apart).
  if ((best & 0x7f) == 0) best = std::signbit(x) ? 0x80 : 0;
  return best;
}

TEST(Quant8, EncodingIsNearestEvenAndSaturates) {
  std::mt19937_64 rng(7);
  std::vector<float> xs = {0.0f,           -0.0f,    448.0f,   464.0f,   480.0f,  1e6f,    -1e6f, 0x1p-10f,
                           0x1p-9f * 1.5f, 0x1p-17f, 57344.0f, 61440.0f, 1.0625f, 1.1875f, -3.3f};
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int i = 0; i < 3000; ++i) xs.push_back(n(rng) * std::exp2(static_cast<float>(i % 40 - 20)));
  // Every midpoint between neighbouring codes: the ties.
  for (int c = 0; c < 0x7e; ++c) {
    xs.push_back(0.5f * (fp8_e4m3_bits_to_f32(static_cast<std::uint8_t>(c)) +
                         fp8_e4m3_bits_to_f32(static_cast<std::uint8_t>(c + 1))));
  }
  for (int c = 0; c < 0x7b; ++c) {
    xs.push_back(-0.5f * (fp8_e5m2_bits_to_f32(static_cast<std::uint8_t>(c)) +
                          fp8_e5m2_bits_to_f32(static_cast<std::uint8_t>(c + 1))));
  }
  for (float x : xs) {
    EXPECT_EQ(f32_to_fp8_e4m3_bits(x), nearest(x, fp8_e4m3_bits_to_f32, 0x7e)) << x;
    EXPECT_EQ(f32_to_fp8_e5m2_bits(x), nearest(x, fp8_e5m2_bits_to_f32, 0x7b)) << x;
    const float r = std::nearbyint(std::fmin(std::fmax(x, -127.0f), 127.0f));
    EXPECT_EQ(static_cast<float>(f32_to_i8(x)), r) << x;
  }
  EXPECT_EQ(f32_to_fp8_e4m3_bits(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_fp8_e5m2_bits(-std::numeric_limits<float>::infinity()), 0xfb);
  EXPECT_TRUE(std::isnan(fp8_e4m3_bits_to_f32(f32_to_fp8_e4m3_bits(std::nanf("")))));
  EXPECT_EQ(f32_to_i8(2.5f), 2);
  EXPECT_EQ(f32_to_i8(-3.5f), -4);
  EXPECT_EQ(f32_to_i8(-300.0f), -127);
}

}  // namespace
}  // namespace attend::detail
