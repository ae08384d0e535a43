// Plans: a selection made once and run many times.
//
// A Plan fixes a problem (spec, mode, device) and the (backend, variant) chosen
// for it. Making one validates the spec and runs every check the mode needs
// exactly once; running it validates only the tensors (shapes, devices, and the
// host contents that locate data), so a decode loop or a training step pays
// for selection once, not per call. Backward always runs where forward ran.
//
//   attend::AttentionSpec spec;  // sizes, dtype, mask, ...
//   attend::Plan plan = attend::Plan::make(spec, attend::Mode::training);
//   std::puts(plan.explain().c_str());              // why this backend and variant
//   plan.forward(inputs, out, lse);                 // as often as needed
//   plan.backward(inputs, out, lse, dout, {dq, dk, dv});
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "attend/backend.h"
#include "attend/device.h"
#include "attend/select.h"
#include "attend/spec.h"

namespace attend {

struct PlanOptions {
  const Policy* policy = nullptr;  // nullptr: the process-wide policy
  Device device{};                 // where the tensors will live
};

// Per-call resources. All optional.
struct RunOptions {
  Workspace workspace{};           // at least workspace_bytes(pass); none: allocated for the call
  Stream stream{};                 // passed to device backends
  Allocator* allocator = nullptr;  // for a workspace allocated by the call; nullptr: host_allocator()
};

// The gradient tensors backward writes (or adds to, with spec.accumulate_grads).
struct GradViews {
  TensorView dq, dk, dv;
  TensorView dbias{};  // spec.bias_requires_grad only
  TensorView dsinks{};  // softmax_type = learnable only: (H), the sinks' dtype
};

class Plan {
 public:
  Plan() = default;
  // Selects (backend, variant) for (spec, mode) on options.device under the
  // policy. Throws attend::Error for an invalid spec or policy, and
  // attend::Error(unsupported) with the whole verdict table when nothing fits.
  static Plan make(const AttentionSpec& spec, Mode mode, const PlanOptions& options = {});

  bool valid() const { return selection_ != nullptr; }
  const AttentionSpec& spec() const { return spec_; }
  Mode mode() const { return mode_; }
  Device device() const { return target_.device; }
  const Backend& backend() const { return *backend_; }
  std::string_view variant() const;
  // The verdicts the choice was made from. For sizes keyed by bucket
  // (spec_fields(): KeyUse::bucket) this may be the selection of an earlier
  // problem of the same bucket, re-checked on this spec; explain() always
  // describes this spec.
  const Selection& selection() const { return *selection_; }
  std::string explain() const;
  std::size_t workspace_bytes(Pass pass) const;

  // Forward into caller-provided out (spec.effective_out_dtype()) and lse.
  void forward(const Inputs& in, const TensorView& out, const TensorView& lse, const RunOptions& run = {}) const;
  // Backward from forward's out and lse (this plan's or any other run of the
  // same spec: no forward context is needed). Needs Mode::training.
  void backward(const Inputs& in, const TensorView& out, const TensorView& lse, const TensorView& dout,
                const GradViews& grads, const RunOptions& run = {}) const;

 private:
  friend struct PlanAccess;
  std::shared_ptr<const Selection> selection_;
  std::shared_ptr<const Backend> backend_;
  AttentionSpec spec_;
  Mode mode_ = Mode::inference;
  Target target_{};
};

}  // namespace attend
