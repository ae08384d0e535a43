// The tool's seeded inputs (cli/problem_data.h): a pure function of (seed,
// stream, element), whatever the thread count or the tensor's length, and
// standard normal in distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attend/tensor.h"
#include "problem_data.h"

namespace attend_cli {
namespace {

using attend::DType;
using attend::Tensor;

bool same_bytes(const Tensor& a, const Tensor& b, std::int64_t elements, std::size_t elem_bytes) {
  return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(elements) * elem_bytes) == 0;
}

// Sizes that end inside a Philox counter, a block and a thread's chunk, and
// cover several chunks, for every dtype.
TEST(CliInputs, IdenticalForEveryThreadCount) {
  for (const std::int64_t n :
       {std::int64_t{1}, std::int64_t{7}, std::int64_t{257}, std::int64_t{3 * 16384 + 5}, std::int64_t{1} << 20}) {
    for (const DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      const Tensor one = normal_tensor(dt, {n}, 42, 1, 1);
      for (const int threads : {2, 3, 8}) {
        const Tensor many = normal_tensor(dt, {n}, 42, 1, threads);
        EXPECT_TRUE(same_bytes(one, many, n, attend::size_of(dt)))
            << "n=" << n << " " << attend::to_string(dt) << " threads=" << threads;
      }
    }
  }
}

// A longer tensor starts with the shorter one's elements: nothing depends on
// where the data ends or how it is cut into blocks.
TEST(CliInputs, ElementDependsOnlyOnSeedStreamAndIndex) {
  const Tensor a = normal_tensor(DType::f32, {100003}, 9, 3, 2), b = normal_tensor(DType::f32, {70001}, 9, 3, 1);
  EXPECT_TRUE(same_bytes(a, b, 70001, sizeof(float)));
  const Tensor other_stream = normal_tensor(DType::f32, {1000}, 9, 4),
               other_seed = normal_tensor(DType::f32, {1000}, 10, 3);
  int equal_stream = 0, equal_seed = 0;
  for (std::int64_t i = 0; i < 1000; ++i) {
    equal_stream += a.as<float>()[i] == other_stream.as<float>()[i];
    equal_seed += a.as<float>()[i] == other_seed.as<float>()[i];
  }
  EXPECT_LE(equal_stream, 2);
  EXPECT_LE(equal_seed, 2);
}

// Bf16 and f64 are the f32 values rounded / widened.
TEST(CliInputs, DtypesHoldTheSameNormalsRounded) {
  const std::int64_t n = 5000;
  const Tensor f = normal_tensor(DType::f32, {n}, 5, 2), h = normal_tensor(DType::bf16, {n}, 5, 2),
               d = normal_tensor(DType::f64, {n}, 5, 2);
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = f.as<float>()[i];
    ASSERT_EQ(d.as<double>()[i], static_cast<double>(x)) << i;
    std::uint32_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    const auto want = static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    ASSERT_EQ(h.as<std::uint16_t>()[i], want) << i;
  }
}

// Moments and tail fractions of 2^22 draws against N(0, 1): mean and
// variance within 5 standard errors, P(|z| > 1, 2, 3) within 5 % (relative),
// and every value finite and inside the generator's radius of 5.77.
TEST(CliInputs, StandardNormalInDistribution) {
  const std::int64_t n = std::int64_t{1} << 22;
  const Tensor t = normal_tensor(DType::f32, {n}, 1, 1);
  double sum = 0, sum2 = 0, sum4 = 0, max_abs = 0;
  std::int64_t beyond[3] = {0, 0, 0};
  for (std::int64_t i = 0; i < n; ++i) {
    const double z = t.as<float>()[i];
    ASSERT_TRUE(std::isfinite(z)) << i;
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
    max_abs = std::max(max_abs, std::abs(z));
    for (int k = 0; k < 3; ++k) beyond[k] += std::abs(z) > k + 1;
  }
  const double mean = sum / static_cast<double>(n), var = sum2 / static_cast<double>(n) - mean * mean;
  const double se = 1.0 / std::sqrt(static_cast<double>(n));
  EXPECT_LT(std::abs(mean), 5 * se);
  EXPECT_LT(std::abs(var - 1.0), 5 * std::sqrt(2.0) * se);
  EXPECT_NEAR(sum4 / static_cast<double>(n), 3.0, 0.05);  // kurtosis of a normal
  const double tails[3] = {0.31731050786291415, 0.04550026389635842, 0.0026997960632601866};
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(static_cast<double>(beyond[k]) / static_cast<double>(n), tails[k], 0.05 * tails[k])
        << "|z| > " << k + 1;
  }
  EXPECT_LE(max_abs, 5.78);
  EXPECT_GT(max_abs, 4.5);
}

// fill_normal's mean and stddev (the ALiBi slopes' 0.25 +- 0.05).
TEST(CliInputs, MeanAndStddevShiftAndScale) {
  const Tensor t = Tensor::zeros(DType::f32, {1 << 16}), z = normal_tensor(DType::f32, {1 << 16}, 3, 6);
  fill_normal(t, 3, 6, 0.25, 0.05);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    ASSERT_EQ(t.as<float>()[i], 0.25f + 0.05f * z.as<float>()[i]) << i;
  }
}

}  // namespace
}  // namespace attend_cli
