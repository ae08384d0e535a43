// Plans: selection once, validation of the tensors on every run.
#include "attend/plan.h"

#include <string>

#include "attend/error.h"
#include "runtime/backend_gate.h"
#include "runtime/select_cache.h"
#include "runtime/validate.h"

namespace attend {

// Backend's kernels are protected; a plan reaches them after the checks that
// Backend::forward/backward would run (done once, when the plan was made).
struct PlanAccess {
  static void forward(const Backend& b, const ForwardArgs& a) { b.run_forward(a); }
  static void backward(const Backend& b, const BackwardArgs& a) { b.run_backward(a); }
  static std::size_t scratch(const Backend& b, const AttentionSpec& s, Pass p, const Target& t) {
    return b.scratch_bytes(s, p, t);
  }
};

Plan Plan::make(const AttentionSpec& spec, Mode mode, const PlanOptions& options) {
  Plan p;
  p.selection_ = detail::select_shared(spec, mode, options.policy, options.device);
  p.backend_ = p.selection_->backend;
  p.spec_ = spec;
  p.mode_ = mode;
  p.target_ = {options.device, p.selection_->variant};
  return p;
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

void Plan::forward(const Inputs& in, const TensorView& out, const TensorView& lse, const RunOptions& run) const {
  if (!valid()) throw Error(ErrorCode::bad_state, "plan", "empty", "a default-constructed plan has no backend");
  require_device(*this, in.q);
  ForwardArgs args{spec_, in, out, lse, run.workspace, target_, run.stream};
  detail::validate_forward_tensors(args);
  const detail::ScopedWorkspace ws(PlanAccess::scratch(*backend_, spec_, Pass::forward, target_), run.workspace,
                                   run.allocator, target_.device, backend_->name(), Pass::forward);
  args.workspace = ws.ws;
  detail::with_alloc_errors(backend_->name(), Pass::forward, [&] { PlanAccess::forward(*backend_, args); });
}

void Plan::backward(const Inputs& in, const TensorView& out, const TensorView& lse, const TensorView& dout,
                    const GradViews& grads, const RunOptions& run) const {
  if (!valid()) throw Error(ErrorCode::bad_state, "plan", "empty", "a default-constructed plan has no backend");
  if (mode_ != Mode::training) {
    throw Error(ErrorCode::bad_state, "plan.mode", "inference",
                "backward needs a plan made for Mode::training: an inference selection never checked that "
                "backend '" +
                    std::string(backend_->name()) + "' has a backward for this problem");
  }
  require_device(*this, in.q);
  BackwardArgs args{spec_,    in,          out,           lse,     dout,       grads.dq,    grads.dk,
                    grads.dv, grads.dbias, run.workspace, target_, run.stream, grads.dsinks};
  detail::validate_backward_tensors(args);
  const detail::ScopedWorkspace ws(PlanAccess::scratch(*backend_, spec_, Pass::backward, target_), run.workspace,
                                   run.allocator, target_.device, backend_->name(), Pass::backward);
  args.workspace = ws.ws;
  detail::with_alloc_errors(backend_->name(), Pass::backward, [&] { PlanAccess::backward(*backend_, args); });
}

}  // namespace attend
