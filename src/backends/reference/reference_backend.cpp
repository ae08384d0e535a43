// The reference backend: every spec field, both passes, f32 and f64 (bf16/f16 upcast).
#include <memory>
#include <string>

#include "attend/backends/reference.h"
#include "backends/reference/reference_kernels.h"

namespace attend {
namespace {

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(ReferenceOptions options) : options_(options) {}

  std::string_view name() const override { return "reference"; }

  // Pure in (spec, pass): the memory bound uses one worker's score matrices,
  // which do not depend on the thread count.
  Support check(const AttentionSpec& spec, Pass pass) const override {
    Support s;
    const bool computed = spec.dtype == DType::f32 || spec.dtype == DType::f64 || spec.dtype == DType::bf16 ||
                          spec.dtype == DType::f16;
    s.require(computed, ReasonCode::dtype,
              "dtype=" + std::string(to_string(spec.dtype)) +
                  " is not computed by reference (f32, f64; bf16 and f16 upcast to the accumulation type)");
    if (spec.dtype == DType::bf16 || spec.dtype == DType::f16) {
      s.note("dtype=" + std::string(to_string(spec.dtype)) + ": upcast element by element to " +
             (options_.accumulate_f64 ? "f64" : "f32") + " (a correctness baseline, not a fast path)");
    }
    if (pass == Pass::backward) {
      s.require(!spec.paged(), ReasonCode::layout,
                "kv_page_size=" + std::to_string(spec.kv_page_size) +
                    ": paged K/V (a KV cache) is inference-only, reference has no backward through it");
    }
    const reference::ScratchPlan plan = reference::plan_scratch(spec, pass, options_.accumulate_f64);
    if (plan.overflow) {
      s.require(false, ReasonCode::memory,
                "score working set for seqlen_q=" + std::to_string(spec.seqlen_q) +
                    " seqlen_kv=" + std::to_string(spec.seqlen_kv) + " overflows size_t");
    } else {
      s.require(plan.score_bytes <= options_.max_score_bytes, ReasonCode::memory,
                "score working set " + std::to_string(plan.score_bytes) + " bytes (" +
                    std::string(to_string(pass)) + ", per worker) exceeds max_score_bytes " +
                    std::to_string(options_.max_score_bytes));
    }
    return s;
  }

  // One worker slice per thread the kernel may use (planned_workers), so the
  // answer depends on the OpenMP thread setting at call time. The kernel copes
  // with a workspace sized under another setting by running fewer workers;
  // results are bitwise the same for any count.
  std::size_t workspace_bytes(const AttentionSpec& spec, Pass pass) const override {
    const reference::ScratchPlan plan = reference::plan_scratch(spec, pass, options_.accumulate_f64);
    return reference::workspace_for(plan, reference::planned_workers(spec, plan.max_tasks));
  }

 protected:
  void run_forward(const ForwardArgs& args) const override {
    reference::forward(args, options_.accumulate_f64, options_.round_intermediates_to_input_dtype);
  }
  void run_backward(const BackwardArgs& args) const override {
    reference::backward(args, options_.accumulate_f64, options_.round_intermediates_to_input_dtype);
  }

 private:
  ReferenceOptions options_;
};

}  // namespace

std::shared_ptr<const Backend> make_reference_backend(ReferenceOptions options) {
  return std::make_shared<const ReferenceBackend>(options);
}

}  // namespace attend
