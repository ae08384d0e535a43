#include "backends/flash/dispatch.h"

#include <cstdlib>
#include <string>

#include "attend/error.h"

namespace attend::flash {

bool cpu_supports(std::string_view isa) {
  if (isa == "scalar") return true;
#if defined(__x86_64__) || defined(__i386__)
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == "avx512") {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("fma");
  }
#endif
  return false;
}

const KernelTable& kernels_for(std::string_view isa) {
  static const KernelTable scalar = kernels_scalar();
#if defined(__x86_64__)
  static const KernelTable avx2 = kernels_avx2();
  static const KernelTable avx512 = kernels_avx512();
#endif
  if (isa != "scalar" && isa != "avx2" && isa != "avx512") {
    throw Error(ErrorCode::invalid_argument, "ATTEND_ISA", std::string(isa), "expected avx512, avx2 or scalar");
  }
  if (!cpu_supports(isa)) {
    throw Error(ErrorCode::unsupported, "ATTEND_ISA", std::string(isa), "this CPU does not support that instruction set");
  }
#if defined(__x86_64__)
  if (isa == "avx512") return avx512;
  if (isa == "avx2") return avx2;
#endif
  return scalar;
}

const KernelTable& active_kernels() {
  static const KernelTable& table = [] () -> const KernelTable& {
    if (const char* forced = std::getenv("ATTEND_ISA"); forced && *forced) return kernels_for(forced);
    for (std::string_view isa : {"avx512", "avx2"}) {
      if (cpu_supports(isa)) return kernels_for(isa);
    }
    return kernels_for("scalar");
  }();
  return table;
}

}  // namespace attend::flash
