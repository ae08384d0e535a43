// The flash backend: tiled online-softmax attention on the CPU (FlashAttention-2
// algorithm), forward and backward, SIMD kernels chosen at run time.
//
// Supports f32, bf16 and f16 in both passes (half types: f32 tiles and
// accumulators, results rounded once to the input dtype, f32 LSE; extra backward
// workspace of group * seqlen_q * head_dim_qk floats per thread for the f32 dQ
// sum); head_dim_qk <= 256 and head_dim_v <= 512 in both passes (equal or
// different, any size); GQA/MQA, causal/window masks, softcap, ALiBi, additive
// bias (forward; no dbias), dropout (the shared Philox mask), varlen, strided
// inputs. Extra memory is per thread and independent of sequence length (f32;
// the bf16/f16 backward adds the dQ sum above), except that the bf16 forward on
// bf16 GEMMs (avx512bf16, avx512amx) packs K/V once per (batch, kv head) for all
// the query heads and blocks that read them: about (head_dim_qk + head_dim_v)
// x 2 bytes per key and pair (AMX pads head_dim_qk to 32), in chunks of pairs
// within ATTEND_FLASH_PACKED_KV_MB MiB (256; 0, or chunks too small to give
// every thread a task: each task packs the blocks it reads).
// Backward is bitwise identical across runs and thread counts.
// Environment: ATTEND_ISA=avx512amx|avx512bf16|avx512|avx2|scalar forces a kernel
// family. Without it the best the CPU has is used, in the order avx512amx
// (where CPU and OS allow AMX: the bf16 forward's and backward's GEMMs on AMX
// tiles), avx512bf16 (the default where AVX512-BF16 comes without AMX, e.g. AMD
// Zen 4/5: the same GEMMs on vdpbf16ps), avx512, avx2, scalar.
// ATTEND_ISA=avx512amx-emu runs the avx512amx kernels on an emulated tile unit,
// bit-identical to AMX hardware and some 100x slower, on any CPU with
// AVX512-BF16 (the test suite runs the AMX family so); nothing else picks it.
// ATTEND_NUM_THREADS caps its threads (else OpenMP's setting).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "attend/backend.h"

namespace attend {

// Head-dim limits of both passes: up to absorbed multi-head latent attention
// (DeepSeek's MLA with the up-projections folded into q and out: qk = 512 + 64
// rope dims = 576, v = 512, one shared latent KV head). Tiles are sized from the
// head dims at run time (heap workspace), so no limit comes from the stack.
inline constexpr std::int64_t kFlashMaxHeadDimQk = 576;
inline constexpr std::int64_t kFlashMaxHeadDimV = 512;

std::shared_ptr<const Backend> make_flash_backend();

// The kernel family flash runs with: "avx512amx", "avx512bf16", "avx512", "avx2", "scalar" or
// "avx512amx-emu" (ATTEND_ISA, or the widest this CPU supports). Throws attend::Error if ATTEND_ISA is
// invalid.
std::string_view flash_active_isa();
// Whether this CPU can run the named kernel family.
bool flash_isa_supported(std::string_view isa);

}  // namespace attend
