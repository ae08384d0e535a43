// Exact combination of partial attention results.
//
// Attention over a key set K split into disjoint parts K_1..K_n can be computed
// part by part (split-KV decoding, ring context parallelism) and combined
// exactly through the log-sum-exps:
//   lse = log sum_s exp(lse_s),   O = sum_s exp(lse_s - lse) * O_s
// A part that saw no key of a row (lse_s = -inf) weighs 0; a row empty in every
// part gets O = 0 and LSE = -inf. NaN in any part's lse or out of a row makes
// that row NaN (IEEE propagation), never silently 0.
#pragma once

#include <span>

#include "attend/spec.h"
#include "attend/tensor.h"

namespace attend {

struct Partial {
  TensorView out;  // expected_shape(spec, Role::out); f32, f64 or spec.dtype
  TensorView lse;  // expected_shape(spec, Role::lse); spec.lse_dtype()
};

// Writes the combination of `parts` (at least one) into out (any floating
// dtype; rounded once) and lse (spec.lse_dtype()). Only the sizes and layout
// of `spec` are used. out and lse may be the tensors of one of the parts
// (in-place accumulation: merge({acc, step}, acc.out, acc.lse)). Host tensors
// only. Throws attend::Error naming the tensor on a shape, dtype or device mismatch.
void merge(const AttentionSpec& spec, std::span<const Partial> parts, const TensorView& out, const TensorView& lse);

}  // namespace attend
