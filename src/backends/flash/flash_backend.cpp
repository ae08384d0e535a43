// The flash backend: capability check, workspace, and the parallel loops over
// the tile kernels of the active ISA.
#include "attend/backends/flash.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "attend/error.h"
#include "backends/flash/dispatch.h"
#include "backends/flash/flash_params.h"
#include "cpu/threads.h"
#include "kernel/f32_range.h"
#include "kernel/kv_support.h"
#include "kernel/sink_grad.h"
#include "runtime/builtin.h"
#include "runtime/checked.h"

namespace attend {
namespace {

// bf16/f16 backward with a bf16/f16 dq: dQ of a task's GQA group is summed in
// f32 across key blocks and rounded once (backward_impl.h), in per-thread
// scratch after the tiles: group * seqlen_q * head_dim_qk floats (seqlen_q is
// the varlen maximum), e.g. 2 MiB per thread at seqlen 4096, head dim 128, no
// GQA. An f32 dq (f32 problems, or spec.dq_dtype = f32) is accumulated in
// place and needs none, so that workspace stays flat in the sequence length.
// Saturating: a huge varlen seqlen_q then fails the workspace allocation as
// out_of_memory instead of overflowing into a small one.
std::int64_t dq_accum_floats(const AttentionSpec& s) {
  if (s.effective_dq_dtype() == DType::f32) return 0;
  return detail::sat_mul(detail::sat_mul(s.group_size(), s.seqlen_q), s.head_dim_qk);
}

// A backward task owns a (batch, kv head) and its GQA group's query heads.
// With fewer such pairs than kBackwardTasks (B=1 MQA or absorbed MLA: one), the
// group is split into equal slices of query heads whose f32 dK/dV shares are
// summed afterwards (store_kv_parts): parallelism for O(seqlen_kv) memory, at
// most the size of dK/dV in f32 per slice. The split depends on the spec only,
// never on the thread count, so the result stays bitwise identical for any
// thread count. kBackwardTasks covers the thread counts of the machines this
// runs on; more cores would want more (a split by key blocks, with dQ shares).
constexpr std::int64_t kBackwardTasks = 8;

std::int64_t backward_splits(const AttentionSpec& s) {
  const std::int64_t group = s.group_size(), pairs = detail::sat_mul(s.batch, s.heads_kv);
  if (group == 1 || pairs >= kBackwardTasks) return 1;
  const std::int64_t want = std::min(group, detail::ceil_div(kBackwardTasks, pairs));
  std::int64_t best = 1;  // the largest divisor of the group within want: equal slices
  for (std::int64_t d = 2; d <= want; ++d) {
    if (group % d == 0) best = d;
  }
  return best;
}

// Floats of one slice's dK/dV share (seqlen_kv: the varlen maximum).
std::int64_t kv_part_floats(const AttentionSpec& s) {
  return detail::sat_mul(s.seqlen_kv, detail::sat_add(s.head_dim_qk, s.head_dim_v));
}

// Floats of all shares, ahead of the per-thread scratch in the workspace
// (rounded to a cache line, so that the scratch stays aligned).
std::int64_t kv_parts_floats(const AttentionSpec& s, std::int64_t splits) {
  if (splits == 1) return 0;
  const std::int64_t n =
      detail::sat_mul(detail::sat_mul(detail::sat_mul(s.batch, s.heads_kv), splits), kv_part_floats(s));
  return detail::sat_add(n, 15) / 16 * 16;
}

std::vector<Variant> make_variants() {
  std::vector<Variant> v;
  for (cpu::Isa isa : flash::kFamilies) {
    const flash::KernelTable& k = flash::kernels_for(isa);
    std::string summary = std::string(k.isa) + " kernels";
    if (k.bf16.half_gemms) summary += "; bf16 GEMMs on " + std::string(k.bf16.half_gemms);
    v.push_back({std::string(cpu::to_string(isa)), summary, std::string(cpu::missing(isa)), static_cast<int>(isa)});
  }
  // Last: the AMX family on the emulated tile unit, which runs only where
  // ATTEND_ISA asks for it (so the tests run the AMX kernels on any AVX512-BF16 CPU).
  const std::string bf16_missing(cpu::missing(cpu::Isa::avx512bf16));
  v.push_back({std::string(cpu::kAmxEmulated),
               std::string(flash::kernels_amx_emulated().isa) + " kernels; bf16 GEMMs on " +
                   flash::kernels_amx_emulated().bf16.half_gemms,
               bf16_missing.empty() ? "" : "the emulated AMX tiles run on AVX512-BF16: " + bf16_missing,
               static_cast<int>(cpu::Isa::avx512amx), true});
  return v;
}

class FlashBackend final : public Backend {
 public:
  std::string_view name() const override { return "flash"; }
  std::span<const Variant> variants() const override { return variants_; }

 protected:
  void supports(const AttentionSpec& s, Pass pass, const Target& target, Support& sup) const override {
    const flash::KernelTable& k = table(target);
    // Every element type in both passes: bf16/f16 are widened while tiles are
    // packed and accumulate in f32 (no upcast copy of the tensors).
    sup.require(s.dtype == DType::f32 || s.dtype == DType::bf16 || s.dtype == DType::f16, ReasonCode::dtype, [&] {
      return "dtype=" + std::string(to_string(s.dtype)) + " is not computed by flash (f32, bf16, f16)";
    });
    detail::require_f32_logit_terms(s, name(), sup);
    detail::require_kv_dtype(s, pass, name(), true, sup);
    // How the family computes a half dtype, said here so that a bf16/f16
    // problem never runs at f32 speed without the explanation telling.
    if (s.dtype == DType::bf16 || s.dtype == DType::f16) {
      sup.note([&] {
        const std::string dtype(to_string(s.dtype)), isa(k.isa);
        if (const char* gemms = k.for_dtype(s.dtype, s.effective_kv_dtype()).half_gemms) {
          return "dtype=" + dtype + ": GEMMs on " + gemms + " (kernel family " + isa +
                 "), f32 softmax and accumulators";
        }
        return "dtype=" + dtype + ": widened to f32 as tiles are packed (kernel family " + isa + " has no " + dtype +
               " GEMM instructions), about the f32 kernels' speed";
      });
    }
    sup.require(s.head_dim_qk <= kFlashMaxHeadDimQk, ReasonCode::head_dim_qk, [&] {
      return "head_dim_qk=" + std::to_string(s.head_dim_qk) + " exceeds the flash limit " +
             std::to_string(kFlashMaxHeadDimQk);
    });
    sup.require(s.head_dim_v <= kFlashMaxHeadDimV, ReasonCode::head_dim_v, [&] {
      return "head_dim_v=" + std::to_string(s.head_dim_v) + " exceeds the flash limit " +
             std::to_string(kFlashMaxHeadDimV);
    });
    if (pass == Pass::backward) {
      sup.require(!s.bias_requires_grad, ReasonCode::bias_grad,
                  "bias_requires_grad=true: flash backward does not compute dbias");
      // Forward reads a paged cache in place (prefill); a cache holds no gradients.
      sup.require(!s.paged(), ReasonCode::layout, [&] {
        return "kv_page_size=" + std::to_string(s.kv_page_size) +
               ": paged K/V (a KV cache) is inference-only, flash has no backward through it";
      });
      sup.require(s.effective_out_dtype() == s.dtype, ReasonCode::out_dtype, [&] {
        return "out_dtype=" + std::string(to_string(s.effective_out_dtype())) +
               ": backward reads out and dout in the input dtype (an f32 out is a forward partial; merge it first)";
      });
    }
  }

  std::size_t scratch_bytes(const AttentionSpec& s, Pass pass, const Target& target) const override {
    const flash::KernelTable& k = table(target);
    if (pass == Pass::forward) return detail::sat_float_bytes(forward_floats(k, s), detail::thread_budget());
    const std::size_t scratch = detail::sat_float_bytes(backward_floats(k, s), detail::thread_budget());
    const std::size_t parts = detail::sat_float_bytes(kv_parts_floats(s, backward_splits(s)), 1);
    return detail::sat_add_bytes(scratch, parts);
  }

  void run_forward(const ForwardArgs& a) const override {
    const flash::KernelTable& k = table(a.target);
    const flash::DtypeKernels& kd = k.for_dtype(a.spec.dtype, a.spec.effective_kv_dtype());
    const flash::FlashParams p = flash::make_forward_params(a);
    // Tasks: (batch, head, query block), query blocks innermost so that threads
    // working side by side share one head's K/V in cache. Later query blocks
    // see more keys under a causal mask, so each head's are queued first.
    struct Task { std::int64_t b, h, qb; };
    std::vector<Task> tasks;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const std::int64_t blocks = (p.span(b).q_len + k.block_m - 1) / k.block_m;
      for (std::int64_t h = 0; h < p.heads_q; ++h) {
        for (std::int64_t qb = blocks - 1; qb >= 0; --qb) tasks.push_back({b, h, qb});
      }
    }
    const std::size_t per_thread = static_cast<std::size_t>(forward_floats(k, a.spec));
    run_parallel(a.workspace, per_thread, static_cast<std::int64_t>(tasks.size()), [&](std::int64_t t, float* scratch) {
      kd.forward_block(p, tasks[t].b, tasks[t].h, tasks[t].qb, scratch);
    });
  }

  void run_backward(const BackwardArgs& a) const override {
    const flash::KernelTable& k = table(a.target);
    const flash::DtypeKernels& kd = k.for_dtype(a.spec.dtype);
    const flash::FlashParams p = flash::make_backward_params(a);
    const std::size_t per_thread = static_cast<std::size_t>(backward_floats(k, a.spec));
    const std::int64_t splits = backward_splits(a.spec), pairs = p.batch * p.heads_kv;
    const std::int64_t part = kv_part_floats(a.spec), parts_floats = kv_parts_floats(a.spec, splits);
    float* parts = static_cast<float*>(a.workspace.data);
    const Workspace scratch_ws{parts + parts_floats,
                               a.workspace.bytes - static_cast<std::size_t>(parts_floats) * sizeof(float)};
    // Task t: pair t / splits, slice t % splits of its group.
    auto task_of = [&](std::int64_t t) {
      const std::int64_t pair = t / splits, slice = t % splits;
      return flash::BackwardTask{pair / p.heads_kv, pair % p.heads_kv, slice * p.group / splits,
                                 (slice + 1) * p.group / splits, splits > 1 ? parts + t * part : nullptr};
    };
    run_parallel(scratch_ws, per_thread, pairs * splits,
                 [&](std::int64_t t, float* scratch) { kd.backward_head(p, task_of(t), scratch); });
    if (splits > 1) {
      // Sum the shares per block of key rows, in parallel over pairs and blocks.
      constexpr std::int64_t kRows = 64;
      std::vector<std::pair<std::int64_t, std::int64_t>> blocks;  // (pair, first key row)
      for (std::int64_t pair = 0; pair < pairs; ++pair) {
        const std::int64_t kv_len = p.span(pair / p.heads_kv).kv_len;
        for (std::int64_t j0 = 0; j0 < kv_len; j0 += kRows) blocks.emplace_back(pair, j0);
      }
      const auto count = static_cast<std::int64_t>(blocks.size());
      const int threads = static_cast<int>(std::clamp<std::int64_t>(count, 1, detail::thread_budget()));
#pragma omp parallel for schedule(static) num_threads(threads)
      for (std::int64_t i = 0; i < count; ++i) {
        const auto [pair, j0] = blocks[static_cast<std::size_t>(i)];
        const std::int64_t kv_len = p.span(pair / p.heads_kv).kv_len;
        kd.store_kv_parts(p, task_of(pair * splits), splits, j0, std::min(kRows, kv_len - j0));
      }
    }
    // The kernels' P = exp(s - LSE) already includes the sink through the LSE;
    // only the sink logits' own gradient is left.
    if (a.spec.softmax_type == SoftmaxType::learnable) detail::sink_gradient(a);
  }

 private:
  static const flash::KernelTable& table(const Target& t) {
    const auto i = static_cast<std::size_t>(t.variant);
    return i < std::size(flash::kFamilies) ? flash::kernels_for(flash::kFamilies[i]) : flash::kernels_amx_emulated();
  }
  // Floats of one thread's scratch: the family's tiles, the element type's
  // extras (bf16 GEMM packs) and, for bf16/f16 backward, the f32 dQ sum.
  static std::int64_t forward_floats(const flash::KernelTable& k, const AttentionSpec& s) {
    const flash::DtypeKernels& kd = k.for_dtype(s.dtype, s.effective_kv_dtype());
    return k.forward_scratch(s.head_dim_qk, s.head_dim_v) +
           (kd.forward_extra ? kd.forward_extra(s.head_dim_qk, s.head_dim_v) : 0);
  }
  static std::int64_t backward_floats(const flash::KernelTable& k, const AttentionSpec& s) {
    const flash::DtypeKernels& kd = k.for_dtype(s.dtype);
    return detail::sat_add(dq_accum_floats(s),
                           k.backward_scratch(s.head_dim_qk, s.head_dim_v) +
                               (kd.backward_extra ? kd.backward_extra(s.head_dim_qk, s.head_dim_v) : 0));
  }

  // Runs fn(task, scratch) for every task; each thread owns one scratch slice.
  template <class Fn>
  static void run_parallel(const Workspace& ws, std::size_t per_thread_floats, std::int64_t tasks, Fn&& fn) {
    const std::size_t slice_bytes = per_thread_floats * sizeof(float);
    const int threads = std::max(1, static_cast<int>(std::min<std::size_t>(
        {static_cast<std::size_t>(detail::thread_budget()), ws.bytes / slice_bytes, static_cast<std::size_t>(std::max<std::int64_t>(tasks, 1))})));
    auto* base = static_cast<float*>(ws.data);
#pragma omp parallel num_threads(threads)
    {
      float* scratch = base + per_thread_floats * static_cast<std::size_t>(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t t = 0; t < tasks; ++t) fn(t, scratch);
    }
  }

  std::vector<Variant> variants_ = make_variants();
};

}  // namespace

std::shared_ptr<const Backend> make_flash_backend() { return std::make_shared<FlashBackend>(); }

std::string_view flash_active_isa() {
  static const auto backend = make_flash_backend();
  return backend->variants()[static_cast<std::size_t>(backend->default_variant())].name;
}

bool flash_isa_supported(std::string_view isa) {
  if (isa == cpu::kAmxEmulated) return cpu::supports(cpu::Isa::avx512bf16);
  const auto parsed = cpu::parse_isa(isa);
  return parsed && cpu::supports(*parsed);
}

namespace backends {
// Priority 100: the general training and prefill backend.
void register_flash(detail::BuiltinBackends& list) { list.add(make_flash_backend(), 100); }
}  // namespace backends

}  // namespace attend
