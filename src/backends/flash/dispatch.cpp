#include "backends/flash/dispatch.h"

namespace attend::flash {

const KernelTable& kernels_for(cpu::Isa isa) {
  static const KernelTable scalar = kernels_scalar();
#if defined(__x86_64__)
  static const KernelTable avx2 = kernels_avx2();
  static const KernelTable avx512 = kernels_avx512();
  static const KernelTable avx512bf16 = kernels_avx512bf16();
  static const KernelTable avx512amx = kernels_avx512amx();
  switch (isa) {
    case cpu::Isa::avx512amx: return avx512amx;
    case cpu::Isa::avx512bf16: return avx512bf16;
    case cpu::Isa::avx512: return avx512;
    case cpu::Isa::avx2: return avx2;
    case cpu::Isa::scalar: break;
  }
#else
  (void)isa;
#endif
  return scalar;
}

const KernelTable& kernels_amx_emulated() {
#if defined(__x86_64__)
  static const KernelTable emulated = kernels_avx512amx_emulated();
  return emulated;
#else
  return kernels_for(cpu::Isa::scalar);
#endif
}

}  // namespace attend::flash
