// The decode backend: capability check, workspace, and the two parallel phases
// (splits, then the combine of sequences that were split).
#include "attend/backends/decode.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "attend/error.h"
#include "backends/decode/decode_params.h"
#include "backends/decode/dispatch.h"
#include "cpu/threads.h"
#include "kernel/f32_range.h"
#include "kernel/kv_support.h"
#include "runtime/builtin.h"
#include "runtime/checked.h"

namespace attend {
namespace {

// Per-thread scratch above this is declined (a `memory` reason): rows of the
// whole GQA group times the head dims must stay a cache-sized working set.
constexpr std::int64_t kMaxScratchFloats = std::int64_t{1} << 24;

std::vector<Variant> make_variants() {
  std::vector<Variant> v;
  for (cpu::Isa isa : decode::kFamilies) {
    v.push_back({std::string(cpu::to_string(isa)), std::string(cpu::to_string(isa)) + " kernels",
                 std::string(cpu::missing(isa)), static_cast<int>(isa)});
  }
  return v;
}

class DecodeBackend final : public Backend {
 public:
  explicit DecodeBackend(DecodeOptions options) : options_(options) {}
  std::string_view name() const override { return "decode"; }
  std::span<const Variant> variants() const override { return variants_; }

 protected:
  void supports(const AttentionSpec& s, Pass pass, const Target&, Support& sup) const override {
    detail::require_kv_dtype(s, pass, name(), true, sup);
    if (pass == Pass::backward) {
      sup.require(false, ReasonCode::no_backward,
                  "decode has no backward pass (a forward-only split-KV inference kernel)");
    }
    sup.require(s.dtype == DType::f32 || s.dtype == DType::bf16 || s.dtype == DType::f16, ReasonCode::dtype, [&] {
      return "dtype=" + std::string(to_string(s.dtype)) +
             " is not computed by decode (f32, bf16, f16; f32 accumulation)";
    });
    sup.require(s.effective_out_dtype() == s.dtype, ReasonCode::out_dtype, [&] {
      return "out_dtype=" + std::string(to_string(s.effective_out_dtype())) +
             ": decode writes out in the input dtype (its own splits are combined in f32 inside)";
    });
    detail::require_f32_logit_terms(s, name(), sup);
    sup.require(s.head_dim_qk <= kDecodeMaxHeadDim, ReasonCode::head_dim_qk, [&] {
      return "head_dim_qk=" + std::to_string(s.head_dim_qk) + " exceeds the decode limit " +
             std::to_string(kDecodeMaxHeadDim);
    });
    sup.require(s.head_dim_v <= kDecodeMaxHeadDim, ReasonCode::head_dim_v, [&] {
      return "head_dim_v=" + std::to_string(s.head_dim_v) + " exceeds the decode limit " +
             std::to_string(kDecodeMaxHeadDim);
    });
    if (s.head_dim_qk <= kDecodeMaxHeadDim && s.head_dim_v <= kDecodeMaxHeadDim) {
      // The plan's sizes saturate; the message must use them, not recompute
      // group_size * seqlen_q, which overflows for a huge varlen seqlen_q.
      const decode::SplitPlan plan = decode::plan_splits(s);
      const std::int64_t floats = plan.scratch_floats;
      sup.require(floats <= kMaxScratchFloats, ReasonCode::memory, [&] {
        return "per-thread scratch of " + std::to_string(floats) + " floats for " + std::to_string(plan.max_rows) +
               " query rows per kv head exceeds " + std::to_string(kMaxScratchFloats);
      });
    }
  }

  // The seqlen_q crossover is a speed preference, not a limit: decode computes
  // any number of query rows correctly, flash is faster above it.
  bool defers(const AttentionSpec& s, Mode, const Target&, std::string* why) const override {
    if (s.seqlen_q <= options_.max_seqlen_q) return false;
    if (why) {
      *why = "seqlen_q=" + std::to_string(s.seqlen_q) + " is above decode's crossover " +
             std::to_string(options_.max_seqlen_q) + " (longer query blocks usually run faster on flash)";
    }
    return true;
  }

  std::size_t scratch_bytes(const AttentionSpec& s, Pass pass, const Target&) const override {
    if (pass == Pass::backward) return 0;
    const decode::SplitPlan plan = decode::plan_splits(s);
    const std::size_t scratch = detail::sat_float_bytes(plan.scratch_floats, detail::thread_budget());
    const std::size_t partial = detail::sat_float_bytes(plan.partial_floats, 1);
    return detail::sat_add_bytes(scratch, partial);
  }

  void run_forward(const ForwardArgs& a) const override {
    const decode::DtypeKernels& k = decode::kernels_for(decode::kFamilies[static_cast<std::size_t>(a.target.variant)])
                                        .for_dtype(a.spec.dtype, a.spec.effective_kv_dtype());
    decode::DecodeParams p = decode::make_params(a);
    auto* base = static_cast<float*>(a.workspace.data);
    p.partial = base;
    float* scratch_base = base + p.plan.partial_floats;
    const std::int64_t per_thread = p.plan.scratch_floats;

    // Heads per task: as many as the scratch holds (streaming whole token
    // rows), fewer when that would leave threads idle. Results do not depend on it.
    struct Task { std::int64_t b, hk0, hk1, split; };
    const int budget = detail::thread_budget();
    std::int64_t total_splits = 0;
    for (std::int64_t b = 0; b < p.batch; ++b) total_splits += p.splits(b);
    std::int64_t chunk = p.plan.head_chunk;
    while (chunk > 1 && total_splits * ((p.heads_kv + chunk - 1) / chunk) < 4 * budget) chunk = (chunk + 1) / 2;
    std::vector<Task> splits;
    std::vector<Task> combines;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const std::int64_t ns = p.splits(b);
      for (std::int64_t s = 0; s < ns; ++s) {
        for (std::int64_t hk = 0; hk < p.heads_kv; hk += chunk) splits.push_back({b, hk, std::min(p.heads_kv, hk + chunk), s});
      }
      for (std::int64_t hk = 0; hk < p.heads_kv && ns > 1; ++hk) combines.push_back({b, hk, hk + 1, 0});
    }
    const std::int64_t n_split = static_cast<std::int64_t>(splits.size());
    const std::int64_t n_combine = static_cast<std::int64_t>(combines.size());
    const std::size_t fit = a.workspace.bytes / sizeof(float) > static_cast<std::size_t>(p.plan.partial_floats)
                                ? (a.workspace.bytes / sizeof(float) - static_cast<std::size_t>(p.plan.partial_floats)) /
                                      static_cast<std::size_t>(per_thread)
                                : 0;
    const int threads = static_cast<int>(std::max<std::int64_t>(
        1, std::min<std::int64_t>({budget, static_cast<std::int64_t>(fit), std::max<std::int64_t>(n_split, 1)})));
#pragma omp parallel num_threads(threads)
    {
      float* scratch = scratch_base + per_thread * omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t t = 0; t < n_split; ++t) k.split(p, splits[t].b, splits[t].hk0, splits[t].hk1, splits[t].split, scratch);
      // The implicit barrier above: every partial is written before any combine.
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t t = 0; t < n_combine; ++t) k.combine(p, combines[t].b, combines[t].hk0);
    }
  }

  void run_backward(const BackwardArgs&) const override {
    // Unreachable: Backend::backward runs check(spec, backward) first, which always fails.
    throw Error(ErrorCode::unsupported, "backend", "decode", "decode has no backward pass");
  }

 private:
  DecodeOptions options_;
  std::vector<Variant> variants_ = make_variants();
};

}  // namespace

std::shared_ptr<const Backend> make_decode_backend(DecodeOptions options) {
  return std::make_shared<const DecodeBackend>(options);
}

std::string_view decode_active_isa() {
  static const auto backend = make_decode_backend();
  return backend->variants()[static_cast<std::size_t>(backend->default_variant())].name;
}

namespace backends {
// Priority 150: above flash for inference with few query rows, where it is
// faster; above its seqlen_q crossover it defers to flash (Backend::defers).
// It has no backward, so training never lands here.
void register_decode(detail::BuiltinBackends& list) { list.add(make_decode_backend(), 150); }
}  // namespace backends

}  // namespace attend
