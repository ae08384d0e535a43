// Overflow-checked size arithmetic. Every size derived from user input goes
// through these so that a huge dimension is an attend::Error, not a wrap-around.
#pragma once

#include <cstddef>
#include <cstdint>
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

}  // namespace attend::detail
