// Internal: the autotune strategy applied to an evaluated selection.
#pragma once

#include "attend/select.h"

namespace attend::detail {

enum class Measure : std::uint8_t {
  never,      // use recorded times only (evaluate(), explanations)
  if_needed,  // time the plans when the bucket has no usable record
  always,     // time them again (attend::tune)
};

// Rewrites sel's choice by the tuned times: every viable verdict gets its
// recorded or measured seconds, and the fastest viable one is chosen. Leaves
// the priority choice (with sel.tuning saying why) when fewer than two plans
// are viable, the tensors are not on the host, or no time can be had.
void apply_autotune(Selection& sel, const AttentionSpec& spec, const Policy& policy, Measure measure);

}  // namespace attend::detail
