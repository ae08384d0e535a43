// The performance targets, read off a finished report: flash forward
// >= 80% of sgemm and >= 3x unfused, backward >= 60% of sgemm, causal >= 1.8x
// faster than non-causal, extra memory flat in S.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "harness.h"

namespace attend::bench {

struct Targets {
  double forward_vs_sgemm = 0.80;
  double forward_vs_unfused = 3.0;
  double backward_vs_sgemm = 0.60;
  double causal_speedup = 1.8;
  // The public entry points (api, api:given rows) against the harness's
  // direct backend call on the same problem: kernel time / public-path time.
  double api_vs_kernel = 0.95;
};

// Uses the largest non-causal problem with a flash forward row (and its causal
// twin); ratios that were not measured print "n/a". Memory flatness is read from
// flash's workspace_bytes at each of memory_seqlens (no run needed).
void print_target_summary(std::ostream& os, const Report& report,
                          const std::vector<std::int64_t>& memory_seqlens = {1024, 4096},
                          const Targets& targets = {});

}  // namespace attend::bench
