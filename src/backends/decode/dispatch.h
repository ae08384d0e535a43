// The decode kernels of one instruction-set family: decode's variants. The
// avx512bf16 family is avx512's but for bf16 queries' scores and P V, on
// vdpbf16ps (decode_impl.h's pair paths); decode has no AMX family (one query row per
// head, or a few, cannot fill a tile), so under ATTEND_ISA=avx512amx it runs
// avx512bf16.
#pragma once

#include <cstdint>
#include <string_view>

#include "backends/decode/decode_params.h"
#include "cpu/isa.h"
#include "kernel/kv_support.h"

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
  detail::Kv8Kernels<DtypeKernels> q8{};  // an 8-bit K/V (forward only)
  const DtypeKernels& for_dtype(DType dtype, DType kv_dtype) const {
    if (is_kv8(kv_dtype)) return detail::kv8_kernels(q8, dtype, kv_dtype);
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
