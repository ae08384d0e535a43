// decode_bench's 8-bit KV section: decode tokens/s over fp8 / int8 caches
// against the unquantized (bf16) cache and the read bandwidth measured in the
// same run, at B=1 on the GQA shapes of small and mid-size models, a context
// sweep, and a chunked prefill over an 8-bit cache (flash).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attend/dtype.h"
#include "attend/spec.h"

namespace decode_bench {

// One cache of the comparison: its pages' dtype and, for 8-bit ones, a scale
// layout (unset: KVCache's default, per_token for i8 and per_head for fp8).
struct KvCase {
  attend::DType dtype;
  std::optional<attend::KVScale> scale;
};

struct Kv8Options {
  // The caches compared: the wide one first (f32, bf16 or f16: the queries'
  // dtype and the baseline), then the 8-bit ones.
  std::vector<KvCase> kv_dtypes;
  int reps = 5;
  std::vector<std::int64_t> contexts{16384, 65536};                          // every shape
  std::vector<std::int64_t> sweep{4096, 8192, 16384, 32768, 65536, 131072};  // one shape
  std::int64_t prefill_prefix = 16384, prefill_chunk = 512;
};

// Parses --kv-dtype's list of DTYPE or DTYPE/SCALE items ("all":
// bf16,fp8_e4m3,fp8_e5m2,i8; e.g. all,i8/per_head separates the cost of a
// dtype from its scale layout's); the wide dtype defaults to bf16. Throws
// attend::Error naming --kv-dtype.
std::vector<KvCase> parse_kv_dtypes(const char* text);

// Prints the section's rows; read_gbs: the STREAM-like read of this run.
void run_kv8_section(const Kv8Options& o, double read_gbs);

}  // namespace decode_bench
