#include "cpu/isa.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attend::cpu {

std::string_view to_string(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512bf16: return "avx512bf16";
    case Isa::avx512amx: return "avx512amx";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view text) {
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::avx512amx}) {
    if (text == to_string(isa)) return isa;
  }
  return std::nullopt;
}

std::string_view isa_names() { return "avx512amx, avx512bf16, avx512, avx2, scalar or avx512amx-emu"; }

namespace {

bool probe(Isa isa) {
  if (isa == Isa::scalar) return true;
#if defined(__x86_64__) || defined(__i386__)
  // The probe may run during static initialisation (a backend's variant list),
  // before libgcc's own constructor has filled the CPU model.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == Isa::avx2) return avx2;
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  if (isa == Isa::avx512) return avx512;
  const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  if (isa == Isa::avx512bf16) return bf16;
#if defined(__linux__)
  if (isa == Isa::avx512amx) {
    // AMX-TILE and AMX-BF16 (CPUID.(7,0):EDX bits 24 and 22), and Linux's leave
    // for this process to use the tile data state (arch_prctl
    // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
    if (!bf16) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtileData) == 0;
  }
#endif
#endif
  return false;
}

}  // namespace

bool supports(Isa isa) {
  // Asked once per family, the answer kept (the AMX request is a system call).
  static const bool answers[] = {probe(Isa::scalar), probe(Isa::avx2), probe(Isa::avx512), probe(Isa::avx512bf16),
                                 probe(Isa::avx512amx)};
  return answers[static_cast<int>(isa)];
}

std::string_view missing(Isa isa) {
  if (supports(isa)) return {};
  switch (isa) {
    case Isa::scalar: return {};
    case Isa::avx2: return "this CPU lacks AVX2 and FMA";
    case Isa::avx512: return "this CPU lacks AVX-512 (F, DQ, BW, VL)";
    case Isa::avx512bf16: return "this CPU lacks AVX512-BF16";
    case Isa::avx512amx: return "this CPU or OS does not allow AMX-BF16 tiles";
  }
  return {};
}

}  // namespace attend::cpu
