// Strict integer validators. CLI11's own numeric checks clamp out-of-range text
// (99999999999999999999 becomes INT64_MAX) and print unreadable limits, so every
// integer flag is checked here on its text before conversion.
#pragma once

#include <charconv>
#include <cstdint>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

namespace attend_cli {

// Accepts decimal integers in [min, max] (the whole string, no sign for min >= 0).
inline CLI::Validator int_in_range(std::int64_t min,
                                   std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
  const std::string desc = min == 1 ? "POSITIVE" : min == 0 ? "NON-NEGATIVE" : "INT";
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        std::int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc::result_out_of_range) return "value " + text + " does not fit in int64";
        if (ec != std::errc() || ptr != end || text.empty()) return "'" + text + "' is not an integer";
        if (v < min) return "value " + text + " must be >= " + std::to_string(min);
        if (v > max) return "value " + text + " must be <= " + std::to_string(max);
        return {};
      },
      desc);
}

inline CLI::Validator positive_int() { return int_in_range(1); }
inline CLI::Validator non_negative_int() { return int_in_range(0); }

// Accepts every uint64 in decimal (seeds: 64 random bits, 2^64 - 1 included).
inline CLI::Validator any_uint64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc::result_out_of_range && ptr == end) {
          return "value " + text + " does not fit in uint64 (at most " +
                 std::to_string(std::numeric_limits<std::uint64_t>::max()) + ")";
        }
        if (ec != std::errc() || ptr != end || text.empty()) return "'" + text + "' is not a non-negative integer";
        return {};
      },
      "UINT64");
}

}  // namespace attend_cli
