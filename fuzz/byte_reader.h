// Turns fuzz bytes into typed values. Reading past the end yields zeros, so any
// input (even empty) decodes to something; the mapping is deterministic, which
// lets the GoogleTest replay of checked-in inputs reproduce a fuzz run exactly.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace attend_fuzz {

class ByteReader {
 public:
  ByteReader(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}

  std::size_t remaining() const { return n_ - pos_; }
  std::uint8_t u8() { return pos_ < n_ ? p_[pos_++] : 0; }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(u8()) << (8 * i);
    return v;
  }
  std::uint64_t u64() { return static_cast<std::uint64_t>(u32()) | static_cast<std::uint64_t>(u32()) << 32; }
  bool flag() { return (u8() & 1) != 0; }
  // True with probability ~1/n: for rare mutations of an otherwise valid field.
  bool rarely(unsigned n) { return u8() % n == 0; }

  // A size or index: mostly small, sometimes a boundary value, sometimes raw.
  std::int64_t size() {
    const std::uint8_t tag = u8();
    if (tag < 200) return tag % 17;  // 0..16
    static constexpr std::array<std::int64_t, 12> kEdges = {
        -1, -2, 0, 1, 255, 65536, std::int64_t{1} << 31, (std::int64_t{1} << 31) - 1, std::int64_t{1} << 40,
        std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min(),
        std::numeric_limits<std::int64_t>::max() / 2 + 1};
    if (tag < 240) return kEdges[tag % kEdges.size()];
    return static_cast<std::int64_t>(u64());
  }

  // A double: mostly ordinary, sometimes special (NaN, inf, huge, denormal) or raw bits.
  double real(double ordinary) {
    const std::uint8_t tag = u8();
    if (tag < 160) return ordinary;
    static constexpr std::array<double, 10> kEdges = {
        0.0, -0.0, 1.0, 0.5, 1e4, -1e4, 1e-310, std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()};
    if (tag < 240) return kEdges[tag % kEdges.size()];
    return std::bit_cast<double>(u64());
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t pos_ = 0;
};

}  // namespace attend_fuzz
