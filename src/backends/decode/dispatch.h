// The decode kernels of one instruction-set family: decode's variants. decode
// is memory-bound: it widens bf16 while loading and has no bf16-GEMM families,
// so under ATTEND_ISA=avx512bf16 or avx512amx it runs its avx512 kernels.
#pragma once

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
  const DtypeKernels& for_dtype(DType dtype) const {
    return dtype == DType::bf16 ? bf16 : dtype == DType::f16 ? f16 : f32;
  }
};


KernelTable kernels_scalar();
KernelTable kernels_avx2();
KernelTable kernels_avx512();

// decode's variants, best first.
inline constexpr cpu::Isa kFamilies[] = {cpu::Isa::avx512, cpu::Isa::avx2, cpu::Isa::scalar};

// The table of a family (the caller checked that the CPU supports it).
const KernelTable& kernels_for(cpu::Isa isa);

}  // namespace attend::decode
