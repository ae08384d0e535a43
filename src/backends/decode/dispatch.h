// The decode kernels of one instruction-set family: decode's variants. The
// avx512bf16 family is avx512's but for a bf16 cache's scores, on vdpbf16ps
// (decode_impl.h's pair path); decode has no AMX family (one query row per
// head, or a few, cannot fill a tile), so under ATTEND_ISA=avx512amx it runs
// avx512bf16.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "backends/decode/decode_params.h"
#include "cpu/isa.h"

namespace attend::decode {

// The kernels of one element type (q/k/v/bias/out); math is f32 in all of them.
struct DtypeKernels {
  // Split `split` of sequence b for kv heads [hk0, hk1).
  void (*split)(const DecodeParams&, std::int64_t b, std::int64_t hk0, std::int64_t hk1, std::int64_t split,
                float* scratch) = nullptr;
  void (*combine)(const DecodeParams&, std::int64_t b, std::int64_t hk) = nullptr;
};

struct KernelTable {
  std::string_view isa;
  DtypeKernels f32, bf16, f16;
  // An 8-bit cache: q8[q/out dtype: f32, bf16, f16][kv dtype: fp8_e4m3, fp8_e5m2, i8].
  std::array<std::array<DtypeKernels, 3>, 3> q8{};
  const DtypeKernels& for_dtype(DType dtype, DType kv_dtype) const {
    if (is_kv8(kv_dtype)) {
      const std::size_t e = dtype == DType::bf16 ? 1 : dtype == DType::f16 ? 2 : 0;
      const std::size_t k = kv_dtype == DType::fp8_e4m3 ? 0 : kv_dtype == DType::fp8_e5m2 ? 1 : 2;
      return q8[e][k];
    }
    return dtype == DType::bf16 ? bf16 : dtype == DType::f16 ? f16 : f32;
  }
};


KernelTable kernels_scalar();
KernelTable kernels_avx2();
KernelTable kernels_avx512();
KernelTable kernels_avx512bf16();

// decode's variants, best first.
inline constexpr cpu::Isa kFamilies[] = {cpu::Isa::avx512bf16, cpu::Isa::avx512, cpu::Isa::avx2, cpu::Isa::scalar};

// The table of a family (the caller checked that the CPU supports it).
const KernelTable& kernels_for(cpu::Isa isa);

}  // namespace attend::decode
