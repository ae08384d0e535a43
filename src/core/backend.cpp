#include "attend/backend.h"

#include <memory>
#include <new>
#include <string>

#include "attend/error.h"

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
  }
  return "other";
}

Support& Support::require(bool condition, ReasonCode code, std::string message) {
  if (!condition) reasons.push_back({code, std::move(message)});
  return *this;
}

Support& Support::note(std::string message) {
  notes.push_back(std::move(message));
  return *this;
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

namespace {

// The gate every kernel passes through: the backend's own check decides.
void require_support(const Backend& backend, const AttentionSpec& spec, Pass pass) {
  const Support support = backend.check(spec, pass);
  if (!support.ok()) {
    throw Error(ErrorCode::unsupported, "backend", std::string(backend.name()),
                std::string(to_string(pass)) + " not supported for " + describe(spec) + ": " +
                    support.to_string());
  }
}

// A caller-provided workspace must be large enough; without one, the call
// allocates its own for its duration.
struct ScopedWorkspace {
  std::unique_ptr<std::byte[]> owned;
  Workspace ws;

  ScopedWorkspace(const Backend& backend, const AttentionSpec& spec, Pass pass, const Workspace& given) : ws(given) {
    const std::size_t need = backend.workspace_bytes(spec, pass);
    if (need == 0) return;
    if (given.data == nullptr) {
      try {
        owned.reset(new std::byte[need]);
      } catch (const std::bad_alloc&) {
        throw Error(ErrorCode::out_of_memory, "workspace.bytes", std::to_string(need), "allocation failed");
      }
      ws = {owned.get(), need};
    } else if (given.bytes < need) {
      throw Error(ErrorCode::invalid_argument, "workspace.bytes", std::to_string(given.bytes),
                  std::string(backend.name()) + " " + std::string(to_string(pass)) + " needs " +
                      std::to_string(need) + " bytes of workspace",
                  std::to_string(need));
    }
  }
};

// A kernel's own allocations (task lists, per-call buffers) may fail too; the
// caller gets an attend::Error, whichever backend it was, never std::bad_alloc.
template <typename Fn>
void with_alloc_errors(const Backend& backend, Pass pass, Fn&& fn) {
  try {
    fn();
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::out_of_memory, "backend", std::string(backend.name()),
                std::string(to_string(pass)) + " could not allocate its buffers");
  }
}

}  // namespace

void Backend::forward(const ForwardArgs& args) const {
  validate_forward(args);
  require_support(*this, args.spec, Pass::forward);
  const ScopedWorkspace scratch(*this, args.spec, Pass::forward, args.workspace);
  ForwardArgs run = args;
  run.workspace = scratch.ws;
  with_alloc_errors(*this, Pass::forward, [&] { run_forward(run); });
}

void Backend::backward(const BackwardArgs& args) const {
  validate_backward(args);
  require_support(*this, args.spec, Pass::backward);
  const ScopedWorkspace scratch(*this, args.spec, Pass::backward, args.workspace);
  BackwardArgs run = args;
  run.workspace = scratch.ws;
  with_alloc_errors(*this, Pass::backward, [&] { run_backward(run); });
}

}  // namespace attend
