// The one CPU-feature probe of every CPU backend: which instruction-set
// families this process may run. Backends name their kernel-family variants
// after these, and the ATTEND_ISA policy caps them by level.
#pragma once

#include <optional>
#include <string_view>

namespace attend::cpu {

// Ordered by width: a wider family implies every narrower one on x86-64.
enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2, avx512bf16 = 3, avx512amx = 4 };

std::string_view to_string(Isa isa);
std::optional<Isa> parse_isa(std::string_view text);
// "avx512amx, avx512bf16, avx512, avx2, scalar or avx512amx-emu", for messages.
std::string_view isa_names();

// The avx512amx family's kernels on the emulated tile unit (cpu/amx_tiles.h):
// bit-identical to AMX hardware, some 100x slower, runs wherever AVX512-BF16
// does. Not a level of the ISA cap but a family run only on request: where
// ATTEND_ISA names it, a backend with a variant of this name runs that variant
// alone (and others are capped at avx512amx); elsewhere no selection picks it.
inline constexpr std::string_view kAmxEmulated = "avx512amx-emu";

// Whether this CPU (and, for AMX, the OS) lets the process run `isa`.
bool supports(Isa isa);
// Why it cannot ("this CPU lacks AVX-512 (F, DQ, BW, VL)"); empty when it can.
std::string_view missing(Isa isa);

}  // namespace attend::cpu
