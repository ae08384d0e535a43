// The high-level entry points: select a backend, allocate outputs, run.
#pragma once

#include <memory>

#include "attend/backend.h"
#include "attend/plan.h"
#include "attend/select.h"
#include "attend/spec.h"
#include "attend/tensor.h"

namespace attend {

struct ForwardResult;
struct Gradients;

// What backward needs from forward. Holds the chosen backend (backward always
// runs there), the spec, the mode and the forward outputs. The input views are
// not copied: q, k, v (and bias, slopes, cu_seqlens) must outlive the context.
class Context {
 public:
  Context() = default;
  const Plan& plan() const { return plan_; }
  const Selection& selection() const { return plan_.selection(); }
  const Backend& backend() const { return plan_.backend(); }
  const AttentionSpec& spec() const { return plan_.spec(); }
  Mode mode() const { return plan_.mode(); }
  bool valid() const { return plan_.valid(); }

 private:
  friend struct ContextAccess;
  Plan plan_;
  Inputs inputs_;
  TensorView out_, lse_;
  Tensor out_storage_, lse_storage_;  // when forward allocated them
  Allocator* allocator_ = nullptr;
  Stream stream_{};
};

// Optional resources of the high-level calls.
struct CallOptions {
  const Policy* policy = nullptr;  // nullptr: the process-wide policy
  // Caller-provided outputs (forward: out, lse; backward: the gradients). An
  // undefined view is allocated by the call from `allocator`.
  TensorView out{}, lse{};
  GradViews grads{};
  Allocator* allocator = nullptr;  // nullptr: host_allocator() (host tensors only)
  Stream stream{};
};

struct ForwardResult {
  Tensor out;   // spec.layout, (.., H, Dv), spec.effective_out_dtype(); undefined when the caller gave out
  Tensor lse;   // (B,H,Sq) or varlen (H,total_q); f32 (f64 for f64 inputs); natural log; likewise
  Context ctx;  // pass to backward()
};

struct Gradients {
  Tensor dq, dk, dv;
  Tensor dbias;  // defined only when spec.bias_requires_grad
  Tensor dsinks;  // defined only when spec.softmax_type is learnable: (H), the sinks' dtype
  // (Each is undefined when the caller provided that view in CallOptions::grads.)
};

// Selects a plan for (spec, mode) on the inputs' device (all tensors must share
// it), validates the inputs and runs forward. Outputs are allocated unless
// given in `options`; with a policy in `options`, that policy applies.
ForwardResult forward(const Inputs& inputs, const AttentionSpec& spec, Mode mode, const CallOptions& options);
ForwardResult forward(const Inputs& inputs, const AttentionSpec& spec, Mode mode,
                      const Policy* policy = nullptr);
ForwardResult forward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const AttentionSpec& spec, Mode mode);

// Runs backward on the plan forward chose. Throws attend::Error(bad_state) for
// a context from Mode::inference or a default-constructed one.
Gradients backward(const Context& ctx, const TensorView& dout);
Gradients backward(const Context& ctx, const TensorView& dout, const CallOptions& options);

// Backward without forward's context: from the inputs, forward's out and lse
// and dout (e.g. a ring step recomputing one block, or a framework that kept
// only out and lse). Selects a Mode::training plan for `spec`.
Gradients backward(const AttentionSpec& spec, const Inputs& inputs, const TensorView& out, const TensorView& lse,
                   const TensorView& dout, const CallOptions& options = {});

}  // namespace attend
