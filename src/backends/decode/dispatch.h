// The decode kernels of one ISA, chosen once at run time with the same rule as
// flash (ATTEND_ISA=avx512|avx2|scalar forces a family; else the widest the CPU has).
#pragma once

#include <cstdint>
#include <string_view>

#include "backends/decode/decode_params.h"

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

const KernelTable& active_kernels();

}  // namespace attend::decode
