// S::transpose of the vector SIMD wrappers (src/cpu/simd_avx512.h,
// simd_avx2.h), the register transpose the flash kernels pack Q^T, K^T and V^T
// with: a W x W block of distinct values comes back with element (i, j) at
// (j, i), for each wrapper the CPU can run. (The scalar wrapper's 1 x 1 block
// is the identity; the scalar/ flash suites run the packing with it.) Each
// wrapper is compiled in its own target region, as in the kernels' isa_*.cpp.
#include <immintrin.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cpu/isa.h"
#include "cpu/target_region.h"

ATTEND_AVX512_WARNINGS_BEGIN()
ATTEND_TARGET_REGION_BEGIN(ATTEND_FEATURES_AVX512)
#include "cpu/simd_avx512.h"
namespace {
void transpose_avx512(const float* in, float* out) {
  using S = attend::cpu::SimdAvx512;
  S::V r[S::W];
  for (int i = 0; i < S::W; ++i) r[i] = S::load(in + i * S::W);
  S::transpose(r);
  for (int i = 0; i < S::W; ++i) S::store(out + i * S::W, r[i]);
}
}  // namespace
ATTEND_TARGET_REGION_END()
ATTEND_AVX512_WARNINGS_END()

ATTEND_TARGET_REGION_BEGIN(ATTEND_FEATURES_AVX2)
#include "cpu/simd_avx2.h"
namespace {
void transpose_avx2(const float* in, float* out) {
  using S = attend::cpu::SimdAvx2;
  S::V r[S::W];
  for (int i = 0; i < S::W; ++i) r[i] = S::load(in + i * S::W);
  S::transpose(r);
  for (int i = 0; i < S::W; ++i) S::store(out + i * S::W, r[i]);
}
}  // namespace
ATTEND_TARGET_REGION_END()

namespace {

using attend::cpu::Isa;

// Element (i, j) = 1000 i + j: every element distinct, and a misplaced one names its source.
std::vector<float> block(int w) {
  std::vector<float> m(static_cast<std::size_t>(w * w));
  for (int i = 0; i < w; ++i) {
    for (int j = 0; j < w; ++j) m[static_cast<std::size_t>(i * w + j)] = static_cast<float>(1000 * i + j);
  }
  return m;
}

void expect_transposed(const std::vector<float>& in, const std::vector<float>& out, int w) {
  for (int i = 0; i < w; ++i) {
    for (int j = 0; j < w; ++j) {
      EXPECT_EQ(out[static_cast<std::size_t>(j * w + i)], in[static_cast<std::size_t>(i * w + j)])
          << "element (" << i << ", " << j << ")";
    }
  }
}

TEST(SimdTranspose, Avx512MovesElementIJToJI) {
  if (!attend::cpu::supports(Isa::avx512)) GTEST_SKIP() << attend::cpu::missing(Isa::avx512);
  constexpr int w = attend::cpu::SimdAvx512::W;
  const std::vector<float> in = block(w);
  std::vector<float> out(in.size());
  transpose_avx512(in.data(), out.data());
  expect_transposed(in, out, w);
}

TEST(SimdTranspose, Avx2MovesElementIJToJI) {
  if (!attend::cpu::supports(Isa::avx2)) GTEST_SKIP() << attend::cpu::missing(Isa::avx2);
  constexpr int w = attend::cpu::SimdAvx2::W;
  const std::vector<float> in = block(w);
  std::vector<float> out(in.size());
  transpose_avx2(in.data(), out.data());
  expect_transposed(in, out, w);
}

}  // namespace
