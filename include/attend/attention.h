// The high-level entry points: select a backend, allocate outputs, run.
#pragma once

#include <memory>

#include "attend/backend.h"
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
  const Selection& selection() const { return *selection_; }
  const Backend& backend() const { return *selection_->backend; }
  const AttentionSpec& spec() const { return spec_; }
  Mode mode() const { return mode_; }
  bool valid() const { return selection_ != nullptr; }

 private:
  friend ForwardResult forward(const Inputs&, const AttentionSpec&, Mode, const Policy*);
  friend Gradients backward(const Context&, const TensorView&);
  std::shared_ptr<const Selection> selection_;
  AttentionSpec spec_;
  Mode mode_ = Mode::inference;
  Inputs inputs_;
  Tensor out_, lse_;
};

struct ForwardResult {
  Tensor out;   // spec.layout, (.., H, Dv), spec.dtype
  Tensor lse;   // (B,H,Sq) or varlen (H,total_q); f32 (f64 for f64 inputs); natural log
  Context ctx;  // pass to backward()
};

struct Gradients {
  Tensor dq, dk, dv;
  Tensor dbias;  // defined only when spec.bias_requires_grad
};

// Selects a backend for (spec, mode) under `policy` (nullptr: the process-wide
// policy), validates the inputs and runs forward.
ForwardResult forward(const Inputs& inputs, const AttentionSpec& spec, Mode mode,
                      const Policy* policy = nullptr);
ForwardResult forward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const AttentionSpec& spec, Mode mode);

// Runs backward on the backend forward chose. Throws attend::Error(bad_state) for
// a context from Mode::inference or a default-constructed one.
Gradients backward(const Context& ctx, const TensorView& dout);

}  // namespace attend
