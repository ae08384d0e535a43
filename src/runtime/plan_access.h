// Internal: the one door into a Plan's kernels, and the "validated" entry the
// high-level API uses. attend::forward/backward validate the spec and the
// input shapes before selecting (shape errors are the caller's to fix, so they
// come before any unsupported verdict); through this entry the plan neither
// validates the spec again when it selects nor the inputs again when it runs.
#pragma once

#include <cstddef>

#include "attend/plan.h"

namespace attend {

struct PlanAccess {
  // Whether the caller already validated the spec and the input tensors'
  // shapes (attend::forward/backward), or the plan must (Plan's public API).
  enum class Checked { nothing, spec_and_inputs };

  static Plan make(const AttentionSpec& spec, Mode mode, const PlanOptions& options, Checked checked);
  static void forward(const Plan& plan, const Inputs& in, const TensorView& out, const TensorView& lse,
                      const RunOptions& run, Checked checked);
  static void backward(const Plan& plan, const Inputs& in, const TensorView& out, const TensorView& lse,
                       const TensorView& dout, const GradViews& grads, const RunOptions& run, Checked checked);

  // Backend's kernels and scratch sizes are protected: a plan reaches them
  // after the checks that Backend::forward/backward would run (its selection
  // ran the backend's check when the plan was made).
  static void forward(const Backend& b, const ForwardArgs& a) { b.run_forward(a); }
  static void backward(const Backend& b, const BackwardArgs& a) { b.run_backward(a); }
  static std::size_t scratch(const Backend& b, const AttentionSpec& s, Pass p, const Target& t) {
    return b.scratch_bytes(s, p, t);
  }
};

}  // namespace attend
