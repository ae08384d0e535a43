// decode_bench's 8-bit KV section: decode tokens/s over fp8 / int8 caches
// against the unquantized (bf16) cache and the read bandwidth measured in the
// same run, at B=1 on the GQA shapes of small and mid-size models, a context
// sweep, and a chunked prefill over an 8-bit cache (flash).
#pragma once

#include <cstdint>
#include <vector>

#include "attend/dtype.h"

namespace decode_bench {

struct Kv8Options {
  // The caches compared: one wide dtype (f32, bf16 or f16: the queries' dtype
  // and the baseline) and any 8-bit ones, each with KVCache's default scales.
  std::vector<attend::DType> kv_dtypes;
  int reps = 5;
  std::vector<std::int64_t> contexts{16384, 65536};                          // every shape
  std::vector<std::int64_t> sweep{4096, 8192, 16384, 32768, 65536, 131072};  // one shape
  std::int64_t prefill_prefix = 16384, prefill_chunk = 512;
};

// Parses --kv-dtype's list ("all": bf16,fp8_e4m3,fp8_e5m2,i8); the wide dtype
// defaults to bf16. Throws attend::Error naming --kv-dtype.
std::vector<attend::DType> parse_kv_dtypes(const char* text);

// Prints the section's rows; read_gbs: the STREAM-like read of this run.
void run_kv8_section(const Kv8Options& o, double read_gbs);

}  // namespace decode_bench
