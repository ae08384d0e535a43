// Plans: selection once, validation of the tensors on every run.
#include "attend/plan.h"

#include <string>

#include "attend/error.h"
#include "runtime/backend_gate.h"
#include "runtime/plan_access.h"
#include "runtime/select_cache.h"
#include "runtime/validate.h"

namespace attend {

Plan PlanAccess::make(const AttentionSpec& spec, Mode mode, const PlanOptions& options, Checked checked) {
  Plan p;
  p.selection_ = detail::select_shared(spec, mode, options.policy, options.device, checked == Checked::spec_and_inputs);
  p.backend_ = p.selection_->backend;
  p.spec_ = spec;
  p.mode_ = mode;
  p.target_ = {options.device, p.selection_->variant};
  return p;
}

Plan Plan::make(const AttentionSpec& spec, Mode mode, const PlanOptions& options) {
  return PlanAccess::make(spec, mode, options, PlanAccess::Checked::nothing);
}

std::string_view Plan::variant() const {
  return backend_ ? std::string_view(backend_->variants()[static_cast<std::size_t>(target_.variant)].name) : "";
}

std::string Plan::explain() const {
  if (!valid()) return "(no plan)\n";
  // A plan made from a bucket-mate's cached selection explains its own spec.
  if (selection_->spec_summary == describe(spec_)) return selection_->explain();
  return evaluate(spec_, mode_, current_policy(), target_.device).explain();
}

std::size_t Plan::workspace_bytes(Pass pass) const {
  if (!valid()) throw Error(ErrorCode::bad_state, "plan", "empty", "a default-constructed plan has no backend");
  return PlanAccess::scratch(*backend_, spec_, pass, target_);
}

namespace {

void require_device(const Plan& plan, const TensorView& q) {
  if (!(q.device == plan.device())) {
    throw Error(ErrorCode::invalid_argument, "q.device", to_string(q.device),
                "this plan was made for tensors on " + to_string(plan.device()));
  }
}

}  // namespace

void PlanAccess::forward(const Plan& plan, const Inputs& in, const TensorView& out, const TensorView& lse,
                         const RunOptions& run, Checked checked) {
  if (!plan.valid()) throw Error(ErrorCode::bad_state, "plan", "empty", "a default-constructed plan has no backend");
  require_device(plan, in.q);
  const ForwardArgs args{plan.spec_, in, out, lse, run.workspace, plan.target_, run.stream};
  detail::validate_forward_tensors(args, checked == Checked::spec_and_inputs);
  const Backend& b = *plan.backend_;
  detail::run_gated(b.name(), Pass::forward, args, scratch(b, plan.spec_, Pass::forward, plan.target_), run.allocator,
                    [&](const ForwardArgs& a) { forward(b, a); });
}

void PlanAccess::backward(const Plan& plan, const Inputs& in, const TensorView& out, const TensorView& lse,
                          const TensorView& dout, const GradViews& grads, const RunOptions& run, Checked checked) {
  if (!plan.valid()) throw Error(ErrorCode::bad_state, "plan", "empty", "a default-constructed plan has no backend");
  const Backend& b = *plan.backend_;
  if (plan.mode_ != Mode::training) {
    throw Error(ErrorCode::bad_state, "plan.mode", "inference",
                "backward needs a plan made for Mode::training: an inference selection never checked that "
                "backend '" +
                    std::string(b.name()) + "' has a backward for this problem");
  }
  require_device(plan, in.q);
  const BackwardArgs args{plan.spec_, in,          out,           lse,          dout,       grads.dq,    grads.dk,
                          grads.dv,   grads.dbias, run.workspace, plan.target_, run.stream, grads.dsinks};
  detail::validate_backward_tensors(args, checked == Checked::spec_and_inputs);
  detail::run_gated(b.name(), Pass::backward, args, scratch(b, plan.spec_, Pass::backward, plan.target_), run.allocator,
                    [&](const BackwardArgs& a) { backward(b, a); });
}

void Plan::forward(const Inputs& in, const TensorView& out, const TensorView& lse, const RunOptions& run) const {
  PlanAccess::forward(*this, in, out, lse, run, PlanAccess::Checked::nothing);
}

void Plan::backward(const Inputs& in, const TensorView& out, const TensorView& lse, const TensorView& dout,
                    const GradViews& grads, const RunOptions& run) const {
  PlanAccess::backward(*this, in, out, lse, dout, grads, run, PlanAccess::Checked::nothing);
}

}  // namespace attend
