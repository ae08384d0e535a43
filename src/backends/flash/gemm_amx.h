// AMX-BF16 tile GEMMs of the bf16 forward (the avx512amx family):
//   C[rows x cols] (= or +=) sum over pairs p of A(r, p) . B(p, col)
// A: row-major 32-bit words, each two bf16 of consecutive depth (2p, 2p + 1);
// B: "VNNI" words [pair][col]; C: f32 row-major. rows and cols multiples of 16,
// pairs a multiple of 16 (zero-padded). Tiles 0-3 accumulate a 32 x 32 block of
// C, 4-5 hold A, 6-7 hold B; a tile is 16 rows of 64 bytes.
#pragma once

#include <cstdint>

namespace attend::flash::ATTEND_FLASH_ISA {

// The tile unit `Tiles` is cpu::AmxTiles or cpu::AmxTilesEmulated (cpu/amx_tiles.h),
// configured by the caller.
template <class Tiles>
void amx_gemm(std::int64_t rows, std::int64_t cols, std::int64_t pairs, const std::uint32_t* a, std::int64_t lda,
              const std::uint32_t* b, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
  const std::int64_t sa = lda * 4, sb = ldb * 4, sc = ldc * 4;
  std::int64_t r = 0;
  for (; r + 32 <= rows; r += 32) {
    for (std::int64_t q = 0; q < cols; q += 32) {
      const bool two = q + 32 <= cols;  // else a last 16-column strip
      float* c00 = c + r * ldc + q;
      float* c10 = c00 + 16 * ldc;
      if (accumulate) {
        Tiles::template load<0>(c00, sc);
        Tiles::template load<2>(c10, sc);
        if (two) {
          Tiles::template load<1>(c00 + 16, sc);
          Tiles::template load<3>(c10 + 16, sc);
        }
      } else {
        Tiles::template zero<0>();
        Tiles::template zero<1>();
        Tiles::template zero<2>();
        Tiles::template zero<3>();
      }
      for (std::int64_t p = 0; p < pairs; p += 16) {
        Tiles::template load<4>(a + r * lda + p, sa);
        Tiles::template load<5>(a + (r + 16) * lda + p, sa);
        Tiles::template load<6>(b + p * ldb + q, sb);
        Tiles::template dpbf16ps<0, 4, 6>();
        Tiles::template dpbf16ps<2, 5, 6>();
        if (two) {
          Tiles::template load<7>(b + p * ldb + q + 16, sb);
          Tiles::template dpbf16ps<1, 4, 7>();
          Tiles::template dpbf16ps<3, 5, 7>();
        }
      }
      Tiles::template store<0>(c00, sc);
      Tiles::template store<2>(c10, sc);
      if (two) {
        Tiles::template store<1>(c00 + 16, sc);
        Tiles::template store<3>(c10 + 16, sc);
      }
    }
  }
  if (r < rows) {  // a last strip of 16 rows
    for (std::int64_t q = 0; q < cols; q += 16) {
      float* c00 = c + r * ldc + q;
      if (accumulate) {
        Tiles::template load<0>(c00, sc);
      } else {
        Tiles::template zero<0>();
      }
      for (std::int64_t p = 0; p < pairs; p += 16) {
        Tiles::template load<4>(a + r * lda + p, sa);
        Tiles::template load<6>(b + p * ldb + q, sb);
        Tiles::template dpbf16ps<0, 4, 6>();
      }
      Tiles::template store<0>(c00, sc);
    }
  }
}

// In-register transpose of a 16 x 16 block of 32-bit words.
inline void transpose16x16(__m512i w[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(w[i], w[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(w[i], w[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    w[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    w[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    w[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    w[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(w[i], w[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(w[i], w[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(w[i + 8], w[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(w[i + 8], w[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    w[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    w[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    w[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    w[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

}  // namespace attend::flash::ATTEND_FLASH_ISA
