// The AMX-BF16 tile unit behind one set of names, native or emulated, so that
// the same kernel source runs on AMX hardware and, exactly, on any CPU with
// AVX512-BF16 (the tests run the avx512amx kernels everywhere; kernels take the
// unit as a template parameter and carry no #ifdef for it).
//
// Both units hold 8 tiles of 16 rows x 64 bytes (palette 1, every tile
// configured at full size, the only shape attend's kernels use):
//   load<T>(base, stride)  tile T <- 16 rows of 64 bytes, `stride` bytes apart
//   store<T>(base, stride) the reverse
//   zero<T>()              tile T <- 0
//   dpbf16ps<C, A, B>()    C[m][n] += sum_k A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1]
//                          (A: 16 x 32 bf16, B: 16 pair rows x 16 columns of bf16
//                          pairs, C: 16 x 16 f32)
//
// The emulation's TDPBF16PS follows the hardware's arithmetic, which is not the
// SDM pseudo-code's order (measured on Sapphire Rapids, bit-identical over
// 384,000 outputs: shared/reference/amx_forward/RESULTS.md): bf16 inputs with a
// zero exponent are read as signed zero; each product is formed in f32; the
// even and the odd products of the pairs are summed in two separate f32 partial
// sums, from zero, in order k = 0..15, each addition rounded to nearest even
// and a denormal result flushed to signed zero; then C + (even + odd), each of
// the two additions rounded and flushed the same way. MXCSR plays no part on
// the hardware; the emulation assumes the default MXCSR (no FTZ/DAZ), which
// attend never changes.
//
// Include inside a target region that enables avx512f/bw/dq/vl, avx512bf16,
// amx-tile and amx-bf16 (cpu/target_region.h): the struct names are unique to
// that region, so tests/backends/check_isa_objects.py counts their functions as
// kernel code.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace attend::cpu {

// The hardware unit. configure() before the first tile instruction of a thread's
// task; release() after its last, so that the OS need not save the tile state.
struct AmxTiles {
  static constexpr bool kEmulated = false;

  static void configure() {
    struct alignas(64) Config {
      std::uint8_t palette = 1, start_row = 0;
      std::uint8_t reserved[14] = {};
      std::uint16_t colsb[16] = {};
      std::uint8_t rows[16] = {};
    } c;
    for (int t = 0; t < 8; ++t) {
      c.colsb[t] = 64;
      c.rows[t] = 16;
    }
    // Own asm: GCC 12's _tile_loadconfig declares only 8 bytes of its operand as
    // read, so the compiler would drop the stores of the row/column counts.
    __asm__ volatile("ldtilecfg %0" : : "m"(c));
  }
  static void release() { _tile_release(); }
  // Own asm, the tile number an immediate: GCC 12's _tile_* macros paste their
  // argument into the register name (no template parameter can be one), and
  // their loads and stores do not tell the compiler that memory is read or
  // written, so a vector store to a buffer could be moved past the tile load
  // of it; the "memory" clobber keeps the two in program order.
  template <int T>
  static void load(const void* base, std::int64_t stride) {
    static_assert(T >= 0 && T < 8);
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" : : "r"(base), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  static void store(void* base, std::int64_t stride) {
    static_assert(T >= 0 && T < 8);
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" : : "r"(base), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  static void zero() {
    static_assert(T >= 0 && T < 8);
    __asm__ volatile("tilezero %%tmm%c0" : : "i"(T));
  }
  template <int C, int A, int B>
  static void dpbf16ps() {
    static_assert(C >= 0 && C < 8 && A >= 0 && A < 8 && B >= 0 && B < 8);
    // AT&T order: B, A, C (Intel's tdpbf16ps C, A, B).
    __asm__ volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" : : "i"(B), "i"(A), "i"(C));
  }
};

// The same unit in AVX-512 registers: a thread-local file of 8 tiles, and
// TDPBF16PS vectorised over a tile row's 16 columns with the rounding model
// above (some 100x slower than the hardware: for correctness, not speed).
struct AmxTilesEmulated {
  static constexpr bool kEmulated = true;

  static void configure() {}  // every tile is always 16 x 64 bytes
  static void release() {}
  template <int T>
  static void load(const void* base, std::int64_t stride) {
    static_assert(T >= 0 && T < 8);
    const auto* src = static_cast<const char*>(base);
    for (int r = 0; r < 16; ++r) _mm512_store_si512(file().t[T][r], _mm512_loadu_si512(src + r * stride));
  }
  template <int T>
  static void store(void* base, std::int64_t stride) {
    static_assert(T >= 0 && T < 8);
    auto* dst = static_cast<char*>(base);
    for (int r = 0; r < 16; ++r) _mm512_storeu_si512(dst + r * stride, _mm512_load_si512(file().t[T][r]));
  }
  template <int T>
  static void zero() {
    static_assert(T >= 0 && T < 8);
    for (int r = 0; r < 16; ++r) _mm512_store_si512(file().t[T][r], _mm512_setzero_si512());
  }
  template <int C, int A, int B>
  static void dpbf16ps() {
    static_assert(C >= 0 && C < 8 && A >= 0 && A < 8 && B >= 0 && B < 8);
    File& f = file();
    // B's 16 pair rows as f32: the even (low) and odd (high) halves of each word.
    __m512 be[16], bo[16];
    for (int k = 0; k < 16; ++k) {
      const __m512i w = _mm512_load_si512(f.t[B][k]);
      be[k] = flush(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
      bo[k] = flush(_mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))));
    }
    for (int m = 0; m < 16; ++m) {
      const __m512i w = _mm512_load_si512(f.t[A][m]);
      const __m512 ae = flush(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
      const __m512 ao =
          flush(_mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))));
      __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
      for (int k = 0; k < 16; ++k) {
        const __m512i lane = _mm512_set1_epi32(k);
        even = flush(add(even, mul(_mm512_permutexvar_ps(lane, ae), be[k])));
        odd = flush(add(odd, mul(_mm512_permutexvar_ps(lane, ao), bo[k])));
      }
      const __m512 c = _mm512_load_ps(reinterpret_cast<const float*>(f.t[C][m]));
      _mm512_store_ps(reinterpret_cast<float*>(f.t[C][m]), flush(add(c, flush(add(even, odd)))));
    }
  }

 private:
  struct alignas(64) File {
    alignas(64) char t[8][16][64];
  };
  static File& file() {
    static thread_local File f;
    return f;
  }
  // Rounded to nearest even whatever MXCSR says, and never contracted into an
  // FMA (GCC's _mm512_mul_ps/_mm512_add_ps are plain vector arithmetic, which
  // -ffp-contract=fast may fuse: an overflowing or denormal product would then
  // not be rounded on its own, as the hardware rounds it).
  static __m512 mul(__m512 a, __m512 b) {
    return _mm512_mul_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static __m512 add(__m512 a, __m512 b) {
    return _mm512_add_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // Denormals to zero of the same sign (fpclass 0x20: denormal).
  static __m512 flush(__m512 x) {
    const __mmask16 tiny = _mm512_fpclass_ps_mask(x, 0x20);
    return _mm512_mask_and_ps(x, tiny, x, _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0x80000000u))));
  }
};

}  // namespace attend::cpu
