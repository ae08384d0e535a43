// Element access by run-time dtype, for the tool's data generation and checks
// (not for kernels). f16 and bf16 are converted with round-to-nearest-even.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "attend/dtype.h"

namespace attend_cli {

inline float bf16_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

inline std::uint16_t float_to_bf16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // keep it a NaN
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float f16_to_float(std::uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) return mant ? std::nanf("") : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
}

inline std::uint16_t float_to_f16(float f) {
  if (std::isnan(f)) return 0x7e00;
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // rounds to infinity
  if (a < std::ldexp(1.0, -14)) {          // subnormal: units of 2^-24, RNE (nearbyint)
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(std::ldexp(a, 24))));
  }
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  auto mant = static_cast<std::uint32_t>(std::nearbyint((m * 2.0 - 1.0) * 1024.0));
  int biased = e - 1 + 15;
  if (mant == 1024) {
    mant = 0;
    ++biased;
  }
  if (biased >= 31) return sign | 0x7c00;
  return static_cast<std::uint16_t>(sign | (biased << 10) | mant);
}

// Element i of contiguous data of the given dtype, as double.
inline double load(const void* data, attend::DType dtype, std::int64_t i) {
  switch (dtype) {
    case attend::DType::f32: return static_cast<const float*>(data)[i];
    case attend::DType::f64: return static_cast<const double*>(data)[i];
    case attend::DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case attend::DType::f16: return f16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case attend::DType::i32: return static_cast<const std::int32_t*>(data)[i];
    case attend::DType::fp8_e4m3:
    case attend::DType::fp8_e5m2:
    case attend::DType::i8: return attend::kv8_value(dtype, static_cast<const std::uint8_t*>(data)[i]);
  }
  return 0.0;
}

inline void store(void* data, attend::DType dtype, std::int64_t i, double value) {
  switch (dtype) {
    case attend::DType::f32: static_cast<float*>(data)[i] = static_cast<float>(value); break;
    case attend::DType::f64: static_cast<double*>(data)[i] = value; break;
    case attend::DType::bf16:
      static_cast<std::uint16_t*>(data)[i] = float_to_bf16(static_cast<float>(value));
      break;
    case attend::DType::f16:
      static_cast<std::uint16_t*>(data)[i] = float_to_f16(static_cast<float>(value));
      break;
    case attend::DType::i32: static_cast<std::int32_t*>(data)[i] = static_cast<std::int32_t>(value); break;
    case attend::DType::fp8_e4m3:
    case attend::DType::fp8_e5m2:
    case attend::DType::i8:
      static_cast<std::uint8_t*>(data)[i] = attend::kv8_code(dtype, static_cast<float>(value));
      break;
  }
}

}  // namespace attend_cli
