// Overflow-checked size arithmetic. Every size derived from user input goes
// through these so that a huge dimension is an attend::Error, not a wrap-around.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "attend/error.h"

namespace attend::detail {

inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw Error(ErrorCode::overflow, std::string(what), std::to_string(a) + "*" + std::to_string(b),
                "size computation overflows int64");
  }
  return r;
}

inline std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    throw Error(ErrorCode::overflow, std::string(what), std::to_string(a) + "+" + std::to_string(b),
                "size computation overflows int64");
  }
  return r;
}

// ceil(a / b) for a >= 0, b >= 1, without the a + b - 1 that overflows.
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// Bytes for `count` elements of `elem_size` bytes, checked against size_t.
inline std::size_t checked_bytes(std::int64_t count, std::size_t elem_size, std::string_view what) {
  std::size_t r = 0;
  if (count < 0 || __builtin_mul_overflow(static_cast<std::size_t>(count), elem_size, &r)) {
    throw Error(ErrorCode::overflow, std::string(what), std::to_string(count), "byte size overflows size_t");
  }
  return r;
}

// Saturating arithmetic for sizes computed before the problem is validated
// against memory (inside a backend's support check, or its scratch sizing): a
// huge dimension saturates to the maximum, which then fails a limit with a
// reason or the allocation as out_of_memory, instead of overflowing.
inline std::int64_t sat_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<std::int64_t>::max() : r;
}

inline std::int64_t sat_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<std::int64_t>::max() : r;
}

// a + b bytes, saturating to SIZE_MAX.
inline std::size_t sat_add_bytes(std::size_t a, std::size_t b) {
  std::size_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<std::size_t>::max() : r;
}

// Bytes of `floats` f32 values times `copies`, saturating to SIZE_MAX.
inline std::size_t sat_float_bytes(std::int64_t floats, std::int64_t copies) {
  std::size_t r = 0;
  if (floats < 0 || copies < 0 ||
      __builtin_mul_overflow(static_cast<std::size_t>(floats), static_cast<std::size_t>(copies) * sizeof(float), &r)) {
    return std::numeric_limits<std::size_t>::max();
  }
  return r;
}

}  // namespace attend::detail
