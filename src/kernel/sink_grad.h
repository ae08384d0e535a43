// The gradient of learnable sink logits from forward's results, for fused
// backends whose kernels need not know the sink: with LSE_i including the sink
// term, P_ij = exp(s_ij - LSE_i) already gives dq/dk/dv, and
//   dz_h = -sum_{b,i} exp(z_h - LSE_bhi) * D_bhi,   D = rowsum(dO * O).
// One pass over out and dout, accumulated in f64 per head in a fixed order
// (deterministic for any thread count).
#pragma once

#include "attend/backend.h"

namespace attend::detail {

// Writes args.dsinks (adds to it with spec.accumulate_grads). Requires
// softmax_type = learnable and validated arguments; host tensors.
void sink_gradient(const BackwardArgs& args);

}  // namespace attend::detail
