// The 8-bit K/V storage types (DType::fp8_e4m3, fp8_e5m2, i8) and their
// portable, bit-exact conversions — the one definition the kernels, the KV
// cache's quantizing append, the CLI and the tests use.
//
// Decoding is exact: every e4m3, e5m2 and int8 value is an f32 (and a bf16).
// Encoding from f32 rounds to nearest, ties to even, and saturates: a finite
// value beyond the largest code (e4m3 448, e5m2 57344, int8 127) becomes that
// code, with its sign. (e4m3 has no infinity; e5m2 has one, but a cache that
// turned an outlier into inf would poison every row reading it, so attend
// never writes it.) NaN encodes as NaN for the fp8 types. Decoding a NaN code
// gives NaN, and e5m2's infinity codes give ±inf, so that a cache written by
// someone else follows the non-finite rules of docs/semantics.md.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernel/half.h"

namespace attend::detail {

inline float fp8_e4m3_bits_to_f32(std::uint8_t b) {
  const std::uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
  float mag = 0.0f;
  if (e == 0xf && m == 0x7) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    mag = static_cast<float>(m) * 0x1p-9f;  // subnormal: m/8 * 2^-6
  } else {
    mag = std::bit_cast<float>(((e + 120u) << 23) | (m << 20));
  }
  return (b & 0x80u) ? -mag : mag;
}

// e5m2 is the upper byte of an f16.
inline float fp8_e5m2_bits_to_f32(std::uint8_t b) { return f16_bits_to_f32(static_cast<std::uint16_t>(b << 8)); }

// Shared encoder of the two fp8 formats, branch-light so that a loop of it
// vectorizes (the KV cache quantizes whole prefills with it): `drop` = 23 -
// mantissa bits, `rebias` = (127 - bias) << mantissa bits, `sub_magic` = 2^(23 +
// the subnormal step's exponent), `min_normal` the smallest normal value,
// `max_value` / `max_code` the largest finite one and its code.
//   normal:    round the f32 bits to nearest even at bit `drop` (the carry
//              ripples into the exponent exactly as a rounding should), rebias;
//   subnormal: |x| + sub_magic rounds |x| to a multiple of the step in the
//              FPU's own round-to-nearest-even; the low bits count the steps.
inline std::uint8_t f32_to_fp8_bits(float f, int drop, std::uint32_t rebias, float sub_magic, float min_normal,
                                    float max_value, std::uint8_t max_code, std::uint8_t nan_code) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7fffffffu;
  const float af = std::bit_cast<float>(a);
  std::uint32_t code = 0;
  if (a > 0x7f800000u) return static_cast<std::uint8_t>(sign | nan_code);
  if (af >= max_value) {
    code = max_code;  // saturate (infinity included)
  } else if (af < min_normal) {
    code = std::bit_cast<std::uint32_t>(af + sub_magic) - std::bit_cast<std::uint32_t>(sub_magic);
  } else {
    const std::uint32_t r = a + ((1u << (drop - 1)) - 1u) + ((a >> drop) & 1u);
    code = (r >> drop) - rebias;
    if (code > max_code) code = max_code;  // rounded up past the largest code
  }
  return static_cast<std::uint8_t>(sign | code);
}

inline std::uint8_t f32_to_fp8_e4m3_bits(float f) {
  return f32_to_fp8_bits(f, 20, (127u - 7u) << 3, 0x1p14f, 0x1p-6f, 448.0f, 0x7e, 0x7f);
}
inline std::uint8_t f32_to_fp8_e5m2_bits(float f) {
  return f32_to_fp8_bits(f, 21, (127u - 15u) << 2, 0x1p7f, 0x1p-14f, 57344.0f, 0x7b, 0x7f);
}

// int8: round(x) to nearest even, clamped to [-127, 127] (symmetric: -128 is never written).
inline std::int8_t f32_to_i8(float f) {
  const float r = std::nearbyint(std::fmin(std::fmax(f, -127.0f), 127.0f));
  return static_cast<std::int8_t>(std::isnan(f) ? 0.0f : r);
}

inline constexpr float kFp8E4m3Max = 448.0f;
inline constexpr float kFp8E5m2Max = 57344.0f;
inline constexpr float kInt8Max = 127.0f;

// Storage types: 1 byte, convert explicitly from f32 (rounding as above) and
// implicitly to f32, like bf16_t and f16_t.
struct fp8_e4m3_t {
  std::uint8_t bits = 0;
  fp8_e4m3_t() = default;
  explicit fp8_e4m3_t(float f) : bits(f32_to_fp8_e4m3_bits(f)) {}
  operator float() const { return fp8_e4m3_bits_to_f32(bits); }  // NOLINT: exact widening
};

struct fp8_e5m2_t {
  std::uint8_t bits = 0;
  fp8_e5m2_t() = default;
  explicit fp8_e5m2_t(float f) : bits(f32_to_fp8_e5m2_bits(f)) {}
  operator float() const { return fp8_e5m2_bits_to_f32(bits); }  // NOLINT: exact widening
};

static_assert(sizeof(fp8_e4m3_t) == 1 && sizeof(fp8_e5m2_t) == 1);

inline float to_f32(fp8_e4m3_t x) { return static_cast<float>(x); }
inline float to_f32(fp8_e5m2_t x) { return static_cast<float>(x); }
inline float to_f32(std::int8_t x) { return static_cast<float>(x); }

// The largest magnitude a code of `T` holds.
template <class T>
constexpr float code_max() {
  if constexpr (std::is_same_v<T, fp8_e4m3_t>) return kFp8E4m3Max;
  if constexpr (std::is_same_v<T, fp8_e5m2_t>) return kFp8E5m2Max;
  return kInt8Max;
}

// The code of x / scale (scale > 0, finite), rounded and saturated as above.
template <class T>
inline T quantize(float x, float scale) {
  if constexpr (std::is_same_v<T, std::int8_t>) {
    return f32_to_i8(x / scale);
  } else {
    return T(x / scale);
  }
}

}  // namespace attend::detail
