#include "backends/flash/dispatch.h"

#include <cstdlib>
#include <string>

#include "attend/error.h"
#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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
  if (isa == "avx512bf16") return cpu_supports("avx512") && __builtin_cpu_supports("avx512bf16");
#if defined(__linux__)
  if (isa == "avx512amx") {
    // AMX-TILE and AMX-BF16 (CPUID.(7,0):EDX bits 24 and 22), and Linux's leave
    // for this process to use the tile data state (arch_prctl
    // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): asked once, the answer kept.
    static const bool ok = [] {
      if (!cpu_supports("avx512bf16")) return false;
      unsigned a = 0, b = 0, c = 0, d = 0;
      if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return false;
      constexpr long kReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
      return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtileData) == 0;
    }();
    return ok;
  }
#endif
#endif
  return false;
}

const KernelTable& kernels_for(std::string_view isa) {
  static const KernelTable scalar = kernels_scalar();
#if defined(__x86_64__)
  static const KernelTable avx2 = kernels_avx2();
  static const KernelTable avx512 = kernels_avx512();
  static const KernelTable avx512bf16 = kernels_avx512bf16();
  static const KernelTable avx512amx = kernels_avx512amx();
#endif
  if (isa != "scalar" && isa != "avx2" && isa != "avx512" && isa != "avx512bf16" && isa != "avx512amx") {
    throw Error(ErrorCode::invalid_argument, "ATTEND_ISA", std::string(isa),
                "expected avx512amx, avx512bf16, avx512, avx2 or scalar");
  }
  if (!cpu_supports(isa)) {
    throw Error(ErrorCode::unsupported, "ATTEND_ISA", std::string(isa), "this CPU does not support that instruction set");
  }
#if defined(__x86_64__)
  if (isa == "avx512bf16") return avx512bf16;
  if (isa == "avx512amx") return avx512amx;
  if (isa == "avx512") return avx512;
  if (isa == "avx2") return avx2;
#endif
  return scalar;
}

const KernelTable& active_kernels() {
  static const KernelTable& table = [] () -> const KernelTable& {
    if (const char* forced = std::getenv("ATTEND_ISA"); forced && *forced) return kernels_for(forced);
    // bf16 decides the order (f32/f16 kernels are avx512's in all three):
    // avx512amx first (bf16 forward/backward 2.8x/2.2x the f32 ones on an Intel
    // part with AMX), then avx512bf16 (vdpbf16ps: 1.8x/1.6x on AMD Zen 5, which
    // has no AMX), then avx512 (bf16 widened to f32 FMAs). README "bf16 and f16".
    for (std::string_view isa : {"avx512amx", "avx512bf16", "avx512", "avx2"}) {
      if (cpu_supports(isa)) return kernels_for(isa);
    }
    return kernels_for("scalar");
  }();
  return table;
}

}  // namespace attend::flash
