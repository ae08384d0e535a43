#include "backends/decode/dispatch.h"

namespace attend::decode {

const KernelTable& kernels_for(cpu::Isa isa) {
  static const KernelTable scalar = kernels_scalar();
#if defined(__x86_64__)
  static const KernelTable avx2 = kernels_avx2();
  static const KernelTable avx512 = kernels_avx512();
  static const KernelTable avx512bf16 = kernels_avx512bf16();
  if (isa >= cpu::Isa::avx512bf16) return avx512bf16;
  if (isa == cpu::Isa::avx512) return avx512;
  if (isa == cpu::Isa::avx2) return avx2;
#else
  (void)isa;
#endif
  return scalar;
}

}  // namespace attend::decode
