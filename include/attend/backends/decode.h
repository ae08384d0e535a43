// The decode backend: split-KV ("flash-decoding") attention for inference with
// few queries per sequence — token-by-token generation over a long KV cache.
//
// The keys of each (sequence, kv head) are cut into splits processed in
// parallel; each split yields a partial output and its LSE, and the partials
// are combined exactly: lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s
// (FA3's flash_attn_combine). All query heads of a GQA group (and all query rows
// of the sequence) share one pass over their kv head, so K/V are read once.
// Reads paged caches (spec.kv_page_size > 0) in place. Memory-bound by design.
//
// Supports f32, bf16 and f16 (K/V and q widened as they are loaded; f32
// accumulation and LSE; out in the input dtype); any head dims up to kDecodeMaxHeadDim (equal or not: 192/128,
// 64/512); GQA/MQA, causal/window masks, softcap, ALiBi, additive bias, dropout,
// varlen, strided and paged K/V. It has no backward: check(spec, Pass::backward)
// says so (ReasonCode::no_backward), so training never selects it. Forward
// runs any seqlen_q; above kDecodeMaxSeqlenQ it defers to flash, which is
// usually faster there (a speed preference of the priority strategy, see
// Backend::defers and bench/decode_bench.cpp; autotune measures instead). The split plan is a function of the
// spec alone, so results are bitwise identical for any thread count.
// Environment: ATTEND_ISA and ATTEND_NUM_THREADS as for flash.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "attend/backend.h"

namespace attend {

// Largest seqlen_q decode does not defer on: above it flash's query-blocked
// kernel usually wins (the crossover measured by bench/decode_bench).
inline constexpr std::int64_t kDecodeMaxSeqlenQ = 16;
inline constexpr std::int64_t kDecodeMaxHeadDim = 1024;

struct DecodeOptions {
  // Largest seqlen_q on which decode does not defer to flash (Backend::defers).
  // The registered backend uses the default.
  std::int64_t max_seqlen_q = kDecodeMaxSeqlenQ;
};

std::shared_ptr<const Backend> make_decode_backend(DecodeOptions options = {});

// The kernel family decode runs with ("avx512", "avx2" or "scalar"); ATTEND_ISA
// forces one (an ISA the CPU lacks is an attend::Error; avx512amx/avx512bf16 run avx512).
std::string_view decode_active_isa();

}  // namespace attend
