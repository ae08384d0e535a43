// One table of kernels per instruction-set family: flash's variants. The
// selector picks one per problem (Target::variant), within the ATTEND_ISA policy.
#pragma once

#include <cstdint>
#include <string_view>

#include "backends/flash/flash_params.h"
#include "cpu/isa.h"
#include "kernel/kv_support.h"

namespace attend::flash {

// The kernels of one element type (of q/k/v/out and the gradients; tiles are f32).
struct DtypeKernels {
  // Forward of query block qb of (batch b, query head h).
  void (*forward_block)(const FlashParams&, std::int64_t b, std::int64_t h, std::int64_t qb, float* scratch) = nullptr;
  // Backward of (batch b, kv head hk) for the task's query heads of its GQA group.
  void (*backward_head)(const FlashParams&, const BackwardTask& task, float* scratch) = nullptr;
  // Split group: stores the sum of the `parts` consecutive dK/dV shares that
  // start at task.kv_part, for key rows [j0, j0 + n) of (task.b, task.hk).
  void (*store_kv_parts)(const FlashParams&, const BackwardTask& task, std::int64_t parts, std::int64_t j0,
                         std::int64_t n) = nullptr;
  // Forward kernels that read K/V packed per (batch, kv head) (FlashParams::
  // packed_kv): packs key blocks [kb0, kb1) of (b, hk) — block kb holds the
  // sequence's keys [kb * block_n, (kb + 1) * block_n) — into the pair's
  // buffer `dst`, packed_block_words apart; scratch is the thread's. Null: the
  // forward packs per task only.
  void (*pack_kv)(const FlashParams&, std::int64_t b, std::int64_t hk, std::int64_t kb0, std::int64_t kb1,
                  std::uint32_t* dst, float* scratch) = nullptr;
  std::int64_t (*packed_block_words)(std::int64_t dqk, std::int64_t dv) = nullptr;
  std::int64_t block_n = 0;  // keys per packed block
  // Floats per thread these kernels need beyond the table's forward_scratch /
  // backward_scratch (and the bf16/f16 dQ sum); null: none.
  std::int64_t (*forward_extra)(std::int64_t dqk, std::int64_t dv) = nullptr;
  std::int64_t (*backward_extra)(std::int64_t dqk, std::int64_t dv) = nullptr;
  // The instructions a half dtype's GEMMs run on (e.g. "AMX-BF16 tiles"); null:
  // it is widened to f32 as tiles are packed and runs at the f32 kernels' speed.
  // flash's check() reports it (Support::notes).
  const char* half_gemms = nullptr;
};

struct KernelTable {
  std::string_view isa;
  std::int64_t block_m = 0;  // query rows per forward task
  DtypeKernels f32, bf16, f16;
  std::int64_t (*forward_scratch)(std::int64_t dqk, std::int64_t dv) = nullptr;   // floats per thread
  std::int64_t (*backward_scratch)(std::int64_t dqk, std::int64_t dv) = nullptr;  // floats per thread
  detail::Kv8Kernels<DtypeKernels> q8{};                                          // an 8-bit K/V (forward only)
  const DtypeKernels& for_dtype(DType dtype, DType kv_dtype) const {
    if (is_kv8(kv_dtype)) return detail::kv8_kernels(q8, dtype, kv_dtype);
    return dtype == DType::bf16 ? bf16 : dtype == DType::f16 ? f16 : f32;
  }
  const DtypeKernels& for_dtype(DType dtype) const { return for_dtype(dtype, dtype); }
};

KernelTable kernels_scalar();
KernelTable kernels_avx2();
KernelTable kernels_avx512();
// Bytes the bf16-GEMM forward may take for K/V packed once per (batch, kv
// head) (flash_backend.cpp): ATTEND_FLASH_PACKED_KV_MB MiB, 256 by default
// (attend::Error naming the variable if it is not a number in range). Tests
// set 0 to run a problem with each task packing its own key blocks (the same
// result, bit for bit), and -1 to return to the environment's; a workspace
// sized under an earlier budget stays valid.
std::int64_t packed_kv_budget();
void set_packed_kv_budget(std::int64_t bytes);
// avx512 plus AVX512-BF16: the bf16 forward and backward run on vdpbf16ps
// (forward_bf16_impl.h, backward_bf16_impl.h).
KernelTable kernels_avx512bf16();
// avx512bf16 plus AMX-BF16: the bf16 forward and backward run on AMX tiles.
KernelTable kernels_avx512amx();
// kernels_avx512amx on the emulated tile unit (cpu/amx_tiles.h): needs AVX512-BF16 only.
KernelTable kernels_avx512amx_emulated();

// flash's variants, best first: one kernel family per instruction set. bf16
// decides the order (the f32/f16 kernels are avx512's in the top three):
// avx512amx first (bf16 forward/backward 2.8x/2.2x the f32 ones on an Intel
// part with AMX), then avx512bf16 (vdpbf16ps: 1.9x/2.0x on AMD Zen 5, which has
// no AMX), then avx512 (bf16 widened to f32 FMAs). README "bf16 and f16".
inline constexpr cpu::Isa kFamilies[] = {cpu::Isa::avx512amx, cpu::Isa::avx512bf16, cpu::Isa::avx512, cpu::Isa::avx2,
                                         cpu::Isa::scalar};
inline constexpr int kNumFamilies = 5;

// The table of a family (the caller checked that the CPU supports it).
const KernelTable& kernels_for(cpu::Isa isa);
// The avx512amx family on emulated tiles (cpu::kAmxEmulated); the caller checked
// that the CPU has AVX512-BF16. Elsewhere than x86-64: the scalar table.
const KernelTable& kernels_amx_emulated();

}  // namespace attend::flash
