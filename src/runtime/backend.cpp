#include "attend/backend.h"

#include <memory>
#include <new>
#include <span>
#include <string>

#include "attend/error.h"
#include "runtime/backend_gate.h"
#include "runtime/policy_state.h"

namespace attend {

std::string_view to_string(ReasonCode code) {
  switch (code) {
    case ReasonCode::dtype: return "dtype";
    case ReasonCode::head_dim_qk: return "head_dim_qk";
    case ReasonCode::head_dim_v: return "head_dim_v";
    case ReasonCode::head_dim_mismatch: return "head_dim_mismatch";
    case ReasonCode::layout: return "layout";
    case ReasonCode::varlen: return "varlen";
    case ReasonCode::gqa: return "gqa";
    case ReasonCode::mask: return "mask";
    case ReasonCode::softcap: return "softcap";
    case ReasonCode::alibi: return "alibi";
    case ReasonCode::bias: return "bias";
    case ReasonCode::bias_grad: return "bias_grad";
    case ReasonCode::dropout: return "dropout";
    case ReasonCode::deterministic: return "deterministic";
    case ReasonCode::no_backward: return "no_backward";
    case ReasonCode::seqlen: return "seqlen";
    case ReasonCode::memory: return "memory";
    case ReasonCode::other: return "other";
    case ReasonCode::device: return "device";
    case ReasonCode::variant: return "variant";
    case ReasonCode::positions: return "positions";
    case ReasonCode::out_dtype: return "out_dtype";
    case ReasonCode::accumulate: return "accumulate";
    case ReasonCode::sinks: return "sinks";
    case ReasonCode::library: return "library";
    case ReasonCode::kv_dtype: return "kv_dtype";
  }
  return "other";
}

std::string Support::to_string() const {
  if (ok()) return "ok";
  std::string s;
  for (const Reason& r : reasons) {
    if (!s.empty()) s += "; ";
    s += r.message;
  }
  return s;
}

std::span<const Variant> Backend::variants() const {
  static const Variant kDefault{"default", "", "", -1};
  return {&kDefault, 1};
}

bool Backend::defers(const AttentionSpec&, Mode, const Target&, std::string*) const { return false; }

int Backend::find_variant(std::string_view name) const {
  const auto all = variants();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

namespace {

// Which of a backend's variants the process-wide policy lets run
// (detail::variant_bar, the selector's rule too), from one policy snapshot.
struct VariantGate {
  std::shared_ptr<const detail::PolicySnapshot> snap = detail::policy_snapshot();
  int cap = detail::isa_cap(*snap);  // throws for an ISA this CPU lacks
  bool named;
  explicit VariantGate(std::span<const Variant> all) : named(detail::isa_names_variant(snap->policy, all)) {}
  detail::VariantBar bar(const Variant& v) const { return detail::variant_bar(v, snap->policy, named, cap, false); }
  bool runnable(const Variant& v) const { return bar(v) == detail::VariantBar::none; }
  std::string why_not(const Variant& v) const {
    switch (bar(v)) {
      case detail::VariantBar::unavailable: return v.unavailable;
      case detail::VariantBar::alone: return "ATTEND_ISA=" + *snap->policy.isa + " runs that variant alone";
      case detail::VariantBar::on_request: return "runs only where ATTEND_ISA names it";
      case detail::VariantBar::above_cap: return "above the ATTEND_ISA cap";
      case detail::VariantBar::none: break;
    }
    return {};
  }
};

// The first variant this process can run under the policy, or -1.
int first_runnable(std::span<const Variant> all) {
  const VariantGate gate(all);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (gate.runnable(all[i])) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

int Backend::default_variant() const {
  const int v = first_runnable(variants());
  if (v >= 0) return v;
  throw Error(ErrorCode::unsupported, "backend", std::string(name()),
              "no variant of this backend can run here within the ISA policy");
}

Target Backend::resolve(const AttentionSpec& spec, Pass pass, const Target& target) const {
  Target t = target;
  if (t.variant < 0) {
    // The first runnable variant that takes this pass: a backend whose variants
    // differ in what they compute (a forward-only tensor-core variant beside a
    // general one) then serves a direct call as the selector would.
    // When none does, the last runnable one answers: variants go best first,
    // so the last is the most general and its reasons are the telling ones.
    const auto all = variants();
    const VariantGate gate(all);
    int last = -1;
    for (std::size_t i = 0; i < all.size() && t.variant < 0; ++i) {
      if (!gate.runnable(all[i])) continue;
      last = static_cast<int>(i);
      if (check(spec, pass, Target{t.device, last}, Support::Detail::codes).ok()) t.variant = last;
    }
    if (t.variant < 0) t.variant = last >= 0 ? last : default_variant();
  }
  if (static_cast<std::size_t>(t.variant) >= variants().size()) {
    throw Error(ErrorCode::invalid_argument, "target.variant", std::to_string(t.variant),
                std::string(name()) + " has " + std::to_string(variants().size()) + " variants");
  }
  return t;
}

Support Backend::check(const AttentionSpec& spec, Pass pass, const Target& target, Support::Detail detail) const {
  Support sup(detail);
  if (target.variant < 0 && first_runnable(variants()) < 0) {
    // Nothing to run here (every variant marked unavailable, or above the
    // ISA cap): an answer with the reasons, as for a variant named explicitly.
    sup.require(false, ReasonCode::variant, [&] {
      std::string why = "no variant of " + std::string(name()) + " can run here";
      const VariantGate gate(variants());
      for (const Variant& v : variants()) why += "; " + v.name + ": " + gate.why_not(v);
      return why;
    });
    return sup;
  }
  const Target t = resolve(spec, pass, target);
  sup.require(serves(t.device.kind), ReasonCode::device, [&] {
    return "tensors on " + to_string(t.device) + ": " + std::string(name()) + " does not serve " +
           std::string(to_string(t.device.kind)) + " memory";
  });
  const Variant& v = variants()[static_cast<std::size_t>(t.variant)];
  sup.require(v.unavailable.empty(), ReasonCode::variant, [&] { return "variant " + v.name + ": " + v.unavailable; });
  if (!sup.ok()) return sup;
  supports(spec, pass, t, sup);
  return sup;
}

std::size_t Backend::workspace_bytes(const AttentionSpec& spec, Pass pass, const Target& target) const {
  return scratch_bytes(spec, pass, resolve(spec, pass, target));
}

namespace detail {

void require_support(const Backend& backend, const AttentionSpec& spec, Pass pass, const Target& target) {
  const Support support = backend.check(spec, pass, target);
  if (!support.ok()) {
    throw Error(ErrorCode::unsupported, "backend", std::string(backend.name()),
                std::string(to_string(pass)) + " not supported for " + describe(spec) + ": " + support.to_string());
  }
}

ScopedWorkspace::ScopedWorkspace(std::size_t need, const Workspace& given, Allocator* allocator, Device device,
                                 std::string_view backend, Pass pass)
    : ws(given) {
  if (need == 0) return;
  if (given.data == nullptr) {
    alloc_ = allocator ? allocator : &host_allocator();
    device_ = device;
    try {
      ws = {alloc_->allocate(need, device), need};
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::out_of_memory, "workspace.bytes", std::to_string(need), "allocation failed");
    }
  } else if (given.bytes < need) {
    throw Error(ErrorCode::invalid_argument, "workspace.bytes", std::to_string(given.bytes),
                std::string(backend) + " " + std::string(to_string(pass)) + " needs " + std::to_string(need) +
                    " bytes of workspace",
                std::to_string(need));
  }
}

ScopedWorkspace::~ScopedWorkspace() {
  if (alloc_ && ws.data) alloc_->deallocate(ws.data, ws.bytes, device_);
}

}  // namespace detail

namespace {

// Backend's entry for both passes: the call's target resolved on the tensors'
// device, the backend's own check, then the gate (`kernel` gets the prepared
// arguments).
template <class Args, class Scratch, class Kernel>
void gated(const Backend& b, Pass pass, const Args& args, const Target& resolved, Scratch&& scratch_bytes,
           Kernel&& kernel) {
  Args run = args;
  run.target = resolved;
  run.target.device = args.in.q.device;
  detail::require_support(b, args.spec, pass, run.target);
  detail::run_gated(b.name(), pass, run, scratch_bytes(run.target), nullptr, kernel);
}

}  // namespace

void Backend::forward(const ForwardArgs& args) const {
  validate_forward(args);
  gated(
      *this, Pass::forward, args, resolve(args.spec, Pass::forward, {args.in.q.device, args.target.variant}),
      [&](const Target& t) { return scratch_bytes(args.spec, Pass::forward, t); },
      [&](const ForwardArgs& run) { run_forward(run); });
}

void Backend::backward(const BackwardArgs& args) const {
  validate_backward(args);
  gated(
      *this, Pass::backward, args, resolve(args.spec, Pass::backward, {args.in.q.device, args.target.variant}),
      [&](const Target& t) { return scratch_bytes(args.spec, Pass::backward, t); },
      [&](const BackwardArgs& run) { run_backward(run); });
}

}  // namespace attend
