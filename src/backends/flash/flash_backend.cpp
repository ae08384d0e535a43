// The flash backend: capability check, workspace, and the parallel loops over
// the tile kernels of the active ISA.
#include "attend/backends/flash.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>
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

// The bf16-GEMM forward reads K/V packed once per (batch, kv head) pair for
// all the pair's tasks — its GQA group's query heads and every query block —
// where more than one task reads each key block; alone, each task packs (and,
// for an 8-bit K/V, widens) the blocks it reads, group x query blocks times
// over. The buffers go ahead of the per-thread scratch and take at most
// flash::packed_kv_budget() bytes: pairs are packed and run in chunks that
// fit, and with none that fits (one pair's K/V past the budget), or chunks
// too small to give every thread a task, the tasks pack.
struct PackedKvPlan {
  std::int64_t blocks = 0, pair_words = 0;  // key blocks and 32-bit words of one pair
  std::int64_t chunk = 0;                   // pairs packed at a time; 0: per task
  // Floats of the buffer: a whole number of cache lines, as every block's words are.
  std::int64_t floats() const { return detail::sat_mul(chunk, pair_words); }
};

PackedKvPlan packed_kv_plan(const flash::KernelTable& k, const AttentionSpec& s) {
  const flash::DtypeKernels& kd = k.for_dtype(s.dtype, s.effective_kv_dtype());
  const std::int64_t tasks_per_pair = detail::sat_mul(s.group_size(), detail::ceil_div(s.seqlen_q, k.block_m));
  if (kd.pack_kv == nullptr || s.seqlen_kv <= 0 || tasks_per_pair < 2) return {};
  PackedKvPlan plan;
  plan.blocks = detail::ceil_div(s.seqlen_kv, kd.block_n);
  plan.pair_words = detail::sat_mul(plan.blocks, kd.packed_block_words(s.head_dim_qk, s.head_dim_v));
  const std::int64_t fit = flash::packed_kv_budget() / detail::sat_mul(plan.pair_words, sizeof(std::uint32_t));
  plan.chunk = std::min(detail::sat_mul(s.batch, s.heads_kv), fit);
  if (detail::sat_mul(plan.chunk, tasks_per_pair) < detail::thread_budget()) plan.chunk = 0;
  return plan;
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
    if (pass == Pass::forward) {
      const std::size_t packed = detail::sat_float_bytes(packed_kv_plan(k, s).floats(), 1);
      return detail::sat_add_bytes(detail::sat_float_bytes(forward_floats(k, s), detail::thread_budget()), packed);
    }
    const std::size_t scratch = detail::sat_float_bytes(backward_floats(k, s), detail::thread_budget());
    const std::size_t parts = detail::sat_float_bytes(kv_parts_floats(s, backward_splits(s)), 1);
    return detail::sat_add_bytes(scratch, parts);
  }

  void run_forward(const ForwardArgs& a) const override {
    const flash::KernelTable& k = table(a.target);
    const flash::DtypeKernels& kd = k.for_dtype(a.spec.dtype, a.spec.effective_kv_dtype());
    flash::FlashParams p = flash::make_forward_params(a);
    const std::size_t per_thread = static_cast<std::size_t>(forward_floats(k, a.spec));
    PackedKvPlan packed = packed_kv_plan(k, a.spec);
    std::int64_t packed_at = packed.floats();
    // A workspace sized before the budget (or the thread budget) changed may
    // lack the room for the buffer and every thread's scratch: pack per task.
    const std::size_t threads = static_cast<std::size_t>(detail::thread_budget());
    if (static_cast<std::size_t>(packed_at) > a.workspace.bytes / sizeof(float) ||
        a.workspace.bytes / sizeof(float) - static_cast<std::size_t>(packed_at) < per_thread * threads) {
      packed = {};
      packed_at = 0;
    }
    auto* buffer = static_cast<std::uint32_t*>(a.workspace.data);
    const Workspace scratch_ws{static_cast<float*>(a.workspace.data) + packed_at,
                               a.workspace.bytes - static_cast<std::size_t>(packed_at) * sizeof(float)};
    const std::int64_t pairs = p.batch * p.heads_kv, chunk = packed.chunk > 0 ? packed.chunk : pairs;
    for (std::int64_t first = 0; first < pairs; first += chunk) {
      const std::int64_t count = std::min(chunk, pairs - first);
      if (packed.chunk > 0) {
        p.packed_kv = buffer;
        p.packed_first = first;
        p.packed_count = count;
        p.packed_words = packed.pair_words;
        p.packed_blocks = packed.blocks;
        pack_pairs(p, kd, scratch_ws, per_thread, buffer);
      }
      // Tasks: (batch, head, query block), query blocks innermost so that
      // threads working side by side share one head's K/V in cache. Later
      // query blocks see more keys under a causal mask, so each head's are
      // queued first.
      struct Task {
        std::int64_t b, h, qb;
      };
      std::vector<Task> tasks;
      for (std::int64_t pair = first; pair < first + count; ++pair) {
        const std::int64_t b = pair / p.heads_kv, hk = pair % p.heads_kv;
        const std::int64_t blocks = (p.span(b).q_len + k.block_m - 1) / k.block_m;
        for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
          for (std::int64_t qb = blocks - 1; qb >= 0; --qb) tasks.push_back({b, h, qb});
        }
      }
      run_parallel(
          scratch_ws, per_thread, static_cast<std::int64_t>(tasks.size()),
          [&](std::int64_t t, float* scratch) { kd.forward_block(p, tasks[t].b, tasks[t].h, tasks[t].qb, scratch); });
    }
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
  // Packs the key blocks the queries of p's packed pairs see, kChunk blocks a
  // task, into buffer (pair packed_first first).
  static void pack_pairs(const flash::FlashParams& p, const flash::DtypeKernels& kd, const Workspace& ws,
                         std::size_t per_thread, std::uint32_t* buffer) {
    constexpr std::int64_t kChunk = 8;
    std::vector<std::array<std::int64_t, 3>> items;  // (pair, first block, end block)
    for (std::int64_t pair = p.packed_first; pair < p.packed_first + p.packed_count; ++pair) {
      const detail::SeqSpan span = p.span(pair / p.heads_kv);
      if (span.q_len <= 0) continue;
      const std::int64_t lo = p.keys(0, span).begin / kd.block_n;
      const std::int64_t hi = std::min(p.packed_blocks, detail::ceil_div(p.keys(span.q_len - 1, span).end, kd.block_n));
      for (std::int64_t kb = lo; kb < hi; kb += kChunk) items.push_back({pair, kb, std::min(kb + kChunk, hi)});
    }
    run_parallel(ws, per_thread, static_cast<std::int64_t>(items.size()), [&](std::int64_t t, float* scratch) {
      const auto [pair, kb0, kb1] = items[static_cast<std::size_t>(t)];
      kd.pack_kv(p, pair / p.heads_kv, pair % p.heads_kv, kb0, kb1, buffer + (pair - p.packed_first) * p.packed_words,
                 scratch);
    });
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

namespace flash {
namespace {

constexpr char kPackedKvEnv[] = "ATTEND_FLASH_PACKED_KV_MB";
constexpr std::int64_t kMaxPackedKvMb = std::int64_t{1} << 24;

std::int64_t budget_from_env() {
  const char* v = std::getenv(kPackedKvEnv);
  if (v == nullptr || *v == '\0') return std::int64_t{256} << 20;
  const std::string_view text(v);
  std::int64_t mb = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), mb);
  if (ec != std::errc() || end != text.data() + text.size() || mb < 0 || mb > kMaxPackedKvMb) {
    throw Error(
        ErrorCode::invalid_argument, kPackedKvEnv, std::string(text),
        "expected a whole number of MiB from 0 (each task packs its own K/V) to " + std::to_string(kMaxPackedKvMb));
  }
  return mb << 20;
}

// -1: not set by set_packed_kv_budget; the environment's (read on each use, so
// that a bad value is reported wherever it is met).
std::atomic<std::int64_t> g_packed_kv_budget{-1};

}  // namespace

std::int64_t packed_kv_budget() {
  const std::int64_t set = g_packed_kv_budget.load(std::memory_order_relaxed);
  return set >= 0 ? set : budget_from_env();
}
void set_packed_kv_budget(std::int64_t bytes) { g_packed_kv_budget.store(std::max<std::int64_t>(-1, bytes)); }

}  // namespace flash

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
