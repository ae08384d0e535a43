// bf16 and f16 storage types and their portable, bit-exact conversions to and
// from f32 — the one definition every backend, the CLI and the tests use.
//
// bf16 is the upper half of an f32 (same exponent range, 8 significant bits):
// widening is a 16-bit shift; narrowing rounds to nearest, ties to even, and
// keeps NaNs NaN (a NaN whose payload lives only in the low bits would
// otherwise round to infinity, so the quiet bit is forced).
// f16 is IEEE binary16 (5 exponent bits, 11 significant bits, subnormals below
// 2^-14, largest finite 65504): narrowing rounds to nearest even, overflows to
// ±inf, keeps subnormals and NaN; widening is exact. These match F16C's
// vcvtps2ph (imm8 = round-to-nearest) / vcvtph2ps bit for bit, so SIMD and
// scalar paths agree exactly.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace attend::detail {

inline float bf16_bits_to_f32(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t f32_to_bf16_bits(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  const std::uint32_t round = 0x7fffu + ((u >> 16) & 1u);                                       // ties to even
  return static_cast<std::uint16_t>((u + round) >> 16);
}

inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) {  // inf, or NaN made quiet (as vcvtph2ps does)
    return std::bit_cast<float>(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u));
  }
  if (exp == 0) {
    // ±0 or subnormal: man * 2^-24, exact in f32.
    const float mag = static_cast<float>(man) * 0x1p-24f;
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

inline std::uint16_t f32_to_f16_bits(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN stays NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Below 2^-14: a subnormal (or 0). Add 0.5 to move the value's bits to the
    // right place; the FPU's own round-to-nearest-even does the rounding.
    const float r = std::bit_cast<float>(a) + 0.5f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(r) - 0x3f000000u));
  }
  const std::uint32_t round = 0xfffu + ((a >> 13) & 1u);  // ties to even on the dropped 13 bits
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>((a - 0x38000000u + round) >> 13));
}

// Storage types: 2 bytes, convert explicitly from f32/f64 (rounding as above)
// and implicitly to f32, so templated code (the reference kernels) can treat them
// like float/double with static_cast.
struct bf16_t {
  std::uint16_t bits = 0;
  bf16_t() = default;
  explicit bf16_t(float f) : bits(f32_to_bf16_bits(f)) {}
  // f64 -> f32 -> bf16: the first rounding can only decide a tie the second
  // would have broken (1 in 2^29 inputs); the reference accepts that.
  explicit bf16_t(double d) : bits(f32_to_bf16_bits(static_cast<float>(d))) {}
  static bf16_t from_bits(std::uint16_t b) {
    bf16_t x;
    x.bits = b;
    return x;
  }
  operator float() const { return bf16_bits_to_f32(bits); }  // NOLINT: exact widening
};

struct f16_t {
  std::uint16_t bits = 0;
  f16_t() = default;
  explicit f16_t(float f) : bits(f32_to_f16_bits(f)) {}
  explicit f16_t(double d) : bits(f32_to_f16_bits(static_cast<float>(d))) {}
  static f16_t from_bits(std::uint16_t b) {
    f16_t x;
    x.bits = b;
    return x;
  }
  operator float() const { return f16_bits_to_f32(bits); }  // NOLINT: exact widening
};

static_assert(sizeof(bf16_t) == 2 && sizeof(f16_t) == 2);

// f32 value of one element of any storage type, and back (rounding as above).
inline float to_f32(float x) { return x; }
inline float to_f32(bf16_t x) { return static_cast<float>(x); }
inline float to_f32(f16_t x) { return static_cast<float>(x); }

template <class E>
inline E from_f32(float x) {
  if constexpr (std::is_same_v<E, float>) {
    return x;
  } else {
    return E(x);
  }
}

// x rounded to the storage type T and back (identity for float/double).
template <typename T, typename Acc>
inline Acc round_to(Acc x) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    return static_cast<Acc>(static_cast<float>(T(static_cast<float>(x))));
  }
}

}  // namespace attend::detail
