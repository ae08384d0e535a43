// The reference backend's math: plain loops over a materialised score matrix.
//
// Work is split into tasks of one (sequence b, kv head) so that the whole GQA
// group of query heads that reads kv head g is handled by one thread, in a fixed
// order. dK/dV therefore need no atomics and every output element is produced by
// exactly one task with a fixed summation order: results are bitwise identical
// for any OpenMP thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attend/backend.h"
#include "attend/spec.h"

namespace attend::reference {

// Per-worker scratch, in bytes, for one pass. Everything is sized from the spec
// (varlen: the maxima seqlen_q/seqlen_kv), so the answer is a pure function of
// (spec, pass, accumulate_f64).
struct ScratchPlan {
  std::size_t score_bytes = 0;   // the Sq x Sk matrices (what max_score_bytes bounds)
  std::size_t worker_bytes = 0;  // score_bytes + row buffers and dK/dV accumulators
  std::int64_t max_tasks = 1;    // upper bound on tasks that can run concurrently
  bool overflow = false;         // a size did not fit in size_t
};
ScratchPlan plan_scratch(const AttentionSpec& spec, Pass pass, bool accumulate_f64);

// Workers a pass runs on: omp_get_max_threads() capped by `tasks`, or 1 when
// the problem is too small to repay waking a thread team. Depends on the
// OpenMP setting at call time; results do not depend on it.
std::int64_t planned_workers(const AttentionSpec& spec, std::int64_t tasks);

// Bytes of workspace for `workers` concurrent workers (plus alignment slack).
std::size_t workspace_for(const ScratchPlan& plan, std::int64_t workers);

// Run the pass. Uses args.workspace for as many workers as it holds (at most
// omp_get_max_threads()); allocates one worker's scratch itself only when the
// caller passed less than that. Throws attend::Error(out_of_memory) on
// allocation failure. Preconditions: spec and tensors validated, dtype f32/f64.
// bf16/f16 inputs are upcast element by element (kernel/half.h) and computed in
// the accumulation type; LSE is f32 for them. round_intermediates rounds every
// intermediate matrix to the input dtype (ReferenceOptions).
void forward(const ForwardArgs& args, bool accumulate_f64, bool round_intermediates = false);
void backward(const BackwardArgs& args, bool accumulate_f64, bool round_intermediates = false);

}  // namespace attend::reference
