// The reference backend: every spec field, both passes, f32 and f64 (bf16/f16 upcast).
#include <charconv>
#include <cstdlib>
#include <memory>
#include <string>

#include "attend/backends/reference.h"
#include "attend/error.h"
#include "backends/reference/reference_kernels.h"
#include "kernel/kv_support.h"
#include "runtime/builtin.h"

namespace attend {
namespace {

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(ReferenceOptions options) : options_(options) {}

  std::string_view name() const override { return "reference"; }

 protected:
  // Pure in (spec, pass): the memory bound uses one worker's score matrices,
  // which do not depend on the thread count.
  void supports(const AttentionSpec& spec, Pass pass, const Target&, Support& s) const override {
    detail::require_kv_dtype(spec, pass, name(), false, s);
    const bool computed = spec.dtype == DType::f32 || spec.dtype == DType::f64 || spec.dtype == DType::bf16 ||
                          spec.dtype == DType::f16;
    s.require(computed, ReasonCode::dtype, [&] {
      return "dtype=" + std::string(to_string(spec.dtype)) +
             " is not computed by reference (f32, f64; bf16 and f16 upcast to the accumulation type)";
    });
    if (spec.dtype == DType::bf16 || spec.dtype == DType::f16) {
      s.note([&] {
        return "dtype=" + std::string(to_string(spec.dtype)) + ": upcast element by element to " +
               (options_.accumulate_f64 ? "f64" : "f32") + " (a correctness baseline, not a fast path)";
      });
    }
    if (pass == Pass::backward) {
      s.require(!spec.paged(), ReasonCode::layout, [&] {
        return "kv_page_size=" + std::to_string(spec.kv_page_size) +
               ": paged K/V (a KV cache) is inference-only, reference has no backward through it";
      });
      s.require(spec.effective_out_dtype() == spec.dtype, ReasonCode::out_dtype, [&] {
        return "out_dtype=" + std::string(to_string(spec.effective_out_dtype())) +
               ": backward reads out and dout in the input dtype (an f32 out is a forward partial; merge it first)";
      });
    }
    const reference::ScratchPlan plan = reference::plan_scratch(spec, pass, options_.accumulate_f64);
    if (plan.overflow) {
      s.require(false, ReasonCode::memory, [&] {
        return "score working set for seqlen_q=" + std::to_string(spec.seqlen_q) +
               " seqlen_kv=" + std::to_string(spec.seqlen_kv) + " overflows size_t";
      });
    } else {
      s.require(plan.score_bytes <= options_.max_score_bytes, ReasonCode::memory, [&] {
        return "score working set " + std::to_string(plan.score_bytes) + " bytes (" + std::string(to_string(pass)) +
               ", per worker) exceeds max_score_bytes " + std::to_string(options_.max_score_bytes);
      });
    }
  }

  // One worker slice per thread the kernel may use (planned_workers), so the
  // answer depends on the OpenMP thread setting at call time. The kernel copes
  // with a workspace sized under another setting by running fewer workers;
  // results are bitwise the same for any count.
  std::size_t scratch_bytes(const AttentionSpec& spec, Pass pass, const Target&) const override {
    const reference::ScratchPlan plan = reference::plan_scratch(spec, pass, options_.accumulate_f64);
    return reference::workspace_for(plan, reference::planned_workers(spec, plan.max_tasks));
  }

  void run_forward(const ForwardArgs& args) const override {
    reference::forward(args, options_.accumulate_f64, options_.round_intermediates_to_input_dtype);
  }
  void run_backward(const BackwardArgs& args) const override {
    reference::backward(args, options_.accumulate_f64, options_.round_intermediates_to_input_dtype);
  }

 private:
  ReferenceOptions options_;
};

// The built-in reference's score-memory budget: ATTEND_REFERENCE_MAX_BYTES (a
// byte count) or ReferenceOptions' default. Read whenever the built-ins are
// (re)built, so Registry::reset_to_builtins() picks up a changed value.
ReferenceOptions builtin_options() {
  ReferenceOptions o;
  if (const char* env = std::getenv("ATTEND_REFERENCE_MAX_BYTES"); env && *env) {
    const std::string_view text(env);
    std::uint64_t v = 0;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || ptr != text.data() + text.size()) {
      throw Error(ErrorCode::invalid_argument, "ATTEND_REFERENCE_MAX_BYTES", std::string(text),
                  "expected a byte count (a non-negative decimal integer)");
    }
    o.max_score_bytes = static_cast<std::size_t>(v);
  }
  return o;
}

}  // namespace

std::shared_ptr<const Backend> make_reference_backend(ReferenceOptions options) {
  return std::make_shared<const ReferenceBackend>(options);
}

namespace backends {
// Priority 0: it runs everything, slowly; the fallback of record.
void register_reference(detail::BuiltinBackends& list) { list.add(make_reference_backend(builtin_options()), 0); }
}  // namespace backends

}  // namespace attend
