// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
//
// Dropout draws one 32-bit word per score element from a counter that is a pure
// function of (seed, batch, head, row, col): counter = (col/4, row, head, batch),
// key = seed, and element (row, col) takes word col%4. Any tiling, any thread
// count and any backend that evaluates the same function gets the same mask.
#pragma once

#include <array>
#include <cstdint>

#include "kernel/hd.h"

namespace attend::detail {

ATTEND_HD inline std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> ctr,
                                                         std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{kM0} * ctr[0];
    const std::uint64_t p1 = std::uint64_t{kM1} * ctr[2];
    ctr = {static_cast<std::uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<std::uint32_t>(p1),
           static_cast<std::uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<std::uint32_t>(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// The dropout keep test for one element. `threshold` comes from keep_threshold().
struct DropoutMask {
  std::uint64_t seed = 0;
  std::uint64_t threshold = 0;  // keep iff word < threshold; 2^32 keeps everything

  static DropoutMask make(std::uint64_t seed, double p) {
    // floor((1-p) * 2^32): the keep probability is exact to 2^-32.
    const double t = (1.0 - p) * 4294967296.0;
    return {seed, t >= 4294967296.0 ? (std::uint64_t{1} << 32) : static_cast<std::uint64_t>(t)};
  }

  ATTEND_HD std::array<std::uint32_t, 4> words(std::int64_t b, std::int64_t h, std::int64_t row,
                                               std::int64_t col4) const {
    return philox4x32({static_cast<std::uint32_t>(col4), static_cast<std::uint32_t>(row), static_cast<std::uint32_t>(h),
                       static_cast<std::uint32_t>(b)},
                      {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  }

  ATTEND_HD bool keep(std::int64_t b, std::int64_t h, std::int64_t row, std::int64_t col) const {
    return words(b, h, row, col >> 2)[col & 3] < threshold;
  }
};

}  // namespace attend::detail
