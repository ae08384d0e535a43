#include "backends/decode/dispatch.h"

#include <cstdlib>
#include <string>

#include "attend/error.h"
#include "backends/flash/dispatch.h"

namespace attend::decode {

namespace {

const KernelTable& kernels_for(std::string_view isa) {
  static const KernelTable scalar = kernels_scalar();
#if defined(__x86_64__)
  static const KernelTable avx2 = kernels_avx2();
  static const KernelTable avx512 = kernels_avx512();
#endif
  if (isa != "scalar" && isa != "avx2" && isa != "avx512" && isa != "avx512bf16" && isa != "avx512amx") {
    throw Error(ErrorCode::invalid_argument, "ATTEND_ISA", std::string(isa),
                "expected avx512amx, avx512bf16, avx512, avx2 or scalar");
  }
  // One CPU-feature rule for every backend: flash's.
  if (!flash::cpu_supports(isa)) {
    throw Error(ErrorCode::unsupported, "ATTEND_ISA", std::string(isa), "this CPU does not support that instruction set");
  }
#if defined(__x86_64__)
  // decode is memory-bound: it widens bf16 while loading and has no separate
  // bf16-GEMM kernels, so flash's avx512bf16/avx512amx families run decode's avx512 ones.
  if (isa == "avx512" || isa == "avx512bf16" || isa == "avx512amx") return avx512;
  if (isa == "avx2") return avx2;
#endif
  return scalar;
}

}  // namespace

const KernelTable& active_kernels() {
  static const KernelTable& table = []() -> const KernelTable& {
    if (const char* forced = std::getenv("ATTEND_ISA"); forced && *forced) return kernels_for(forced);
    for (std::string_view isa : {"avx512", "avx2"}) {
      if (flash::cpu_supports(isa)) return kernels_for(isa);
    }
    return kernels_for("scalar");
  }();
  return table;
}

}  // namespace attend::decode
