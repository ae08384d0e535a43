// The flash kernels compiled for avx512. Standard and project headers come first,
// outside the target region, so only the kernel code below is built for avx512
// and no shared inline function can leak wider instructions into other paths.
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backends/flash/dispatch.h"
#include "backends/flash/flash_params.h"
#include "backends/flash/kernel_traits.h"
#include "cpu/target_region.h"
#include "kernel/half.h"
#include "kernel/quant8.h"

ATTEND_AVX512_WARNINGS_BEGIN()
ATTEND_TARGET_REGION_BEGIN(ATTEND_FEATURES_AVX512)

// Order matters below: the ISA macros and SIMD wrapper come before the kernel bodies.
// clang-format off
#define ATTEND_FLASH_ISA isa_avx512
#include "cpu/simd_avx512.h"
#include "backends/flash/gemm_tile.h"
#include "backends/flash/logits_tile.h"
#include "backends/flash/forward_impl.h"
#include "backends/flash/backward_impl.h"
ATTEND_TARGET_REGION_END()
// The bf16 kernels of the avx512bf16 and avx512amx families: the same
// instructions plus AVX512-BF16 and AMX. Reached only through kernels_avx512bf16() and
// kernels_avx512amx(), which dispatch.cpp hands out only when the CPU (and, for
// AMX, the OS) allows them; the compiler never emits these instructions itself.
// kernels_avx512amx_emulated() runs the same kernels on the emulated tile unit
// (AVX512-BF16 only).
ATTEND_TARGET_REGION_BEGIN(ATTEND_FEATURES_AVX512_BF16_AMX)
#include "cpu/amx_tiles.h"
#include "backends/flash/gemm_bf16.h"
#include "backends/flash/gemm_amx.h"
#include "backends/flash/forward_bf16_impl.h"
#include "backends/flash/backward_bf16_impl.h"
// clang-format on
ATTEND_TARGET_REGION_END()
ATTEND_AVX512_WARNINGS_END()

namespace attend::flash {

KernelTable kernels_avx512() {
  using detail::bf16_t;
  using detail::f16_t;
  namespace k = isa_avx512;
  KernelTable t{"avx512",
                KernelTraits<SimdAvx512>::fwd_m,
                {&k::forward_block<SimdAvx512, float>, &k::backward_head<SimdAvx512, float>,
                 &k::store_kv_parts<SimdAvx512, float>},
                {&k::forward_block<SimdAvx512, bf16_t>, &k::backward_head<SimdAvx512, bf16_t>,
                 &k::store_kv_parts<SimdAvx512, bf16_t>},
                {&k::forward_block<SimdAvx512, f16_t>, &k::backward_head<SimdAvx512, f16_t>,
                 &k::store_kv_parts<SimdAvx512, f16_t>},
                &forward_scratch_floats<SimdAvx512>,
                &backward_scratch_floats<SimdAvx512>};
  t.q8 = k::q8_forward_kernels<SimdAvx512>();
  return t;
}

namespace {

// The bf16 forward's K/V packing once per (batch, kv head) (FlashParams::packed_kv).
template <class Tiles, class KV>
void with_packed_kv(DtypeKernels& k) {
  k.pack_kv = &isa_avx512::pack_kv_blocks<SimdAvx512, Tiles, KV>;
  k.packed_block_words = &isa_avx512::packed_block_words<SimdAvx512, Tiles>;
  k.block_n = KernelTraits<SimdAvx512>::fwd_n;
}

// bf16 queries over an 8-bit K/V: the bf16 forward on the codes (exact in
// bf16), on vdpbf16ps (Tiles = void) or AMX tiles.
template <class Tiles>
std::array<DtypeKernels, 3> bf16_q8_kernels(const char* gemms) {
  const auto one = [&]<class KV>(KV*) {
    DtypeKernels k;
    k.forward_block = &isa_avx512::forward_block_bf16_gemm<SimdAvx512, Tiles, KV>;
    k.forward_extra = &isa_avx512::forward_bf16_extra_floats<SimdAvx512, Tiles, true>;
    with_packed_kv<Tiles, KV>(k);
    k.half_gemms = gemms;
    return k;
  };
  return {one(static_cast<detail::fp8_e4m3_t*>(nullptr)), one(static_cast<detail::fp8_e5m2_t*>(nullptr)),
          one(static_cast<std::int8_t*>(nullptr))};
}

}  // namespace

// avx512 with the bf16 forward and backward on vdpbf16ps; everything else is avx512's.
KernelTable kernels_avx512bf16() {
  KernelTable t = kernels_avx512();
  t.isa = "avx512bf16";
  t.bf16.forward_block = &isa_avx512::forward_block_bf16_gemm<SimdAvx512>;
  t.bf16.forward_extra = &isa_avx512::forward_bf16_extra_floats<SimdAvx512, void, false>;
  with_packed_kv<void, detail::bf16_t>(t.bf16);
  t.bf16.backward_head = &isa_avx512::backward_head_bf16_gemm<SimdAvx512, void>;
  t.bf16.backward_extra = &isa_avx512::backward_bf16_extra_floats<SimdAvx512>;
  t.bf16.half_gemms = "AVX512-BF16 (vdpbf16ps)";
  t.q8[1] = bf16_q8_kernels<void>("AVX512-BF16 (vdpbf16ps) on the codes as bf16");
  return t;
}

namespace {

template <class Tiles>
KernelTable with_amx_tiles(std::string_view isa, const char* gemms) {
  KernelTable t = kernels_avx512bf16();
  t.isa = isa;
  t.bf16.forward_block = &isa_avx512::forward_block_bf16_gemm<SimdAvx512, Tiles>;
  t.bf16.forward_extra = &isa_avx512::forward_bf16_extra_floats<SimdAvx512, Tiles, false>;
  with_packed_kv<Tiles, detail::bf16_t>(t.bf16);
  t.bf16.backward_head = &isa_avx512::backward_head_bf16_gemm<SimdAvx512, Tiles>;
  t.bf16.half_gemms = gemms;
  t.q8[1] = bf16_q8_kernels<Tiles>(gemms);
  return t;
}

}  // namespace

// avx512 with the bf16 forward and backward on AMX tiles; everything else is avx512's.
KernelTable kernels_avx512amx() { return with_amx_tiles<cpu::AmxTiles>("avx512amx", "AMX-BF16 tiles"); }

KernelTable kernels_avx512amx_emulated() {
  return with_amx_tiles<cpu::AmxTilesEmulated>("avx512amx-emu", "AMX-BF16 tiles, emulated (exact, slow)");
}

}  // namespace attend::flash
