// The high-level entry points: make (or reuse) a plan, provide outputs, run.
#include "attend/attention.h"

#include <span>
#include <string>

#include "attend/error.h"
#include "runtime/plan_access.h"

namespace attend {

struct ContextAccess {
  static Context make(Plan plan, const Inputs& in, const TensorView& out, const TensorView& lse, Tensor out_storage,
                      Tensor lse_storage, Allocator* allocator, Stream stream) {
    Context c;
    c.plan_ = std::move(plan);
    c.inputs_ = in;
    c.out_ = out;
    c.lse_ = lse;
    c.out_storage_ = std::move(out_storage);
    c.lse_storage_ = std::move(lse_storage);
    c.allocator_ = allocator;
    c.stream_ = stream;
    return c;
  }
  static const Inputs& inputs(const Context& c) { return c.inputs_; }
  static const TensorView& out(const Context& c) { return c.out_; }
  static const TensorView& lse(const Context& c) { return c.lse_; }
};

namespace {

// The device every tensor of a call shares (validation reports a mismatch).
Device device_of(const Inputs& in) { return in.q.device; }

// An output the caller did not provide. Kernels write every row of every
// sequence (empty rows included) and the gate defines the rows of a packed
// batch past cu_seqlens[B] (detail::define_uncovered_rows), so no output
// needs a zero-fill, whose page faults cost more than a small kernel.
Tensor allocate(const AttentionSpec& s, Role role, std::span<const std::int64_t> dims, Device device,
                Allocator* allocator) {
  Allocator& a = allocator ? *allocator : host_allocator();
  return Tensor::empty(expected_dtype(s, role), dims, device, a);
}

Tensor allocate(const AttentionSpec& s, Role role, Device device, Allocator* allocator) {
  const Shape shape = expected_shape(s, role);
  return allocate(s, role, shape.span(), device, allocator);
}

// Gradients of k/v (paged pools included) and bias have their inputs' shapes.
Tensor allocate_like(const AttentionSpec& s, Role role, const TensorView& input, Device device, Allocator* allocator) {
  return allocate(s, role, std::span<const std::int64_t>(input.shape.data(), static_cast<std::size_t>(input.ndim)),
                  device, allocator);
}

}  // namespace

ForwardResult forward(const Inputs& inputs, const AttentionSpec& spec, Mode mode, const CallOptions& options) {
  // Shape errors first: they are the caller's to fix. Then the plan's
  // validated entry, which checks neither again.
  validate(spec);
  validate_input_shapes(spec, inputs);
  const Device device = device_of(inputs);
  Plan plan = PlanAccess::make(spec, mode, {options.policy, device}, PlanAccess::Checked::spec_and_inputs);
  ForwardResult r;
  TensorView out = options.out, lse = options.lse;
  if (!out.defined()) {
    r.out = allocate(spec, Role::out, device, options.allocator);
    out = r.out;
  }
  if (!lse.defined()) {
    r.lse = allocate(spec, Role::lse, device, options.allocator);
    lse = r.lse;
  }
  PlanAccess::forward(plan, inputs, out, lse, {{}, options.stream, options.allocator},
                      PlanAccess::Checked::spec_and_inputs);
  r.ctx = ContextAccess::make(std::move(plan), inputs, out, lse, r.out, r.lse, options.allocator, options.stream);
  return r;
}

ForwardResult forward(const Inputs& inputs, const AttentionSpec& spec, Mode mode, const Policy* policy) {
  CallOptions o;
  o.policy = policy;
  return forward(inputs, spec, mode, o);
}

ForwardResult forward(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionSpec& spec,
                      Mode mode) {
  Inputs in;
  in.q = q;
  in.k = k;
  in.v = v;
  return forward(in, spec, mode, CallOptions{});
}

namespace {

Gradients run_backward(const Plan& plan, const Inputs& in, const TensorView& out, const TensorView& lse,
                       const TensorView& dout, const CallOptions& options) {
  const AttentionSpec& s = plan.spec();
  const Device device = plan.device();
  Gradients g;
  GradViews views = options.grads;
  if (s.accumulate_grads && (!views.dq.defined() || !views.dk.defined() || !views.dv.defined())) {
    throw Error(ErrorCode::invalid_argument, "grads", "undefined",
                "spec.accumulate_grads adds into dq, dk and dv: pass them in CallOptions::grads");
  }
  if (!views.dq.defined()) views.dq = g.dq = allocate(s, Role::dq, device, options.allocator);
  if (!views.dk.defined()) views.dk = g.dk = allocate_like(s, Role::dk, in.k, device, options.allocator);
  if (!views.dv.defined()) views.dv = g.dv = allocate_like(s, Role::dv, in.v, device, options.allocator);
  if (s.bias_requires_grad && !views.dbias.defined()) {
    // dbias sums over broadcast dims: the kernels accumulate into it, so it starts at zero.
    views.dbias = g.dbias = Tensor::zeros_like(in.bias);
  }
  if (s.softmax_type == SoftmaxType::learnable && !views.dsinks.defined()) {
    if (s.accumulate_grads) {
      throw Error(ErrorCode::invalid_argument, "grads.dsinks", "undefined",
                  "spec.accumulate_grads adds into dsinks too: pass it in CallOptions::grads");
    }
    views.dsinks = g.dsinks = allocate(s, Role::dsinks, device, options.allocator);
  }
  PlanAccess::backward(plan, in, out, lse, dout, views, {{}, options.stream, options.allocator},
                       PlanAccess::Checked::spec_and_inputs);
  return g;
}

}  // namespace

Gradients backward(const Context& ctx, const TensorView& dout, const CallOptions& options) {
  if (!ctx.valid()) {
    throw Error(ErrorCode::bad_state, "context", "empty", "backward needs the context returned by forward()");
  }
  if (ctx.mode() != Mode::training) {
    throw Error(ErrorCode::bad_state, "context.mode", "inference",
                "backward needs a context from Mode::training: an inference selection never checked "
                "that backend '" +
                    std::string(ctx.backend().name()) + "' has a backward for this problem");
  }
  // Always the plan forward ran on.
  return run_backward(ctx.plan(), ContextAccess::inputs(ctx), ContextAccess::out(ctx), ContextAccess::lse(ctx), dout,
                      options);
}

Gradients backward(const Context& ctx, const TensorView& dout) { return backward(ctx, dout, CallOptions{}); }

Gradients backward(const AttentionSpec& spec, const Inputs& inputs, const TensorView& out, const TensorView& lse,
                   const TensorView& dout, const CallOptions& options) {
  validate(spec);
  validate_input_shapes(spec, inputs);
  const Plan plan =
      PlanAccess::make(spec, Mode::training, {options.policy, device_of(inputs)}, PlanAccess::Checked::spec_and_inputs);
  return run_backward(plan, inputs, out, lse, dout, options);
}

}  // namespace attend
