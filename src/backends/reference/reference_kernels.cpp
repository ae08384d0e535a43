// The reference forward pass, scratch planning and the dtype dispatch.
#include "backends/reference/reference_kernels.h"

#include "backends/reference/reference_common.h"

namespace attend::reference {
namespace impl {
namespace {

template <typename T, typename Acc>
void forward_task(const Problem<T, Acc>& pr, const ForwardArgs& a, std::int64_t b, std::int64_t kvh,
                  WorkerScratch<Acc> ws) {
  const detail::SeqSpan& sp = pr.spans[b];
  const detail::TokenStrides os = detail::token_strides(a.out, pr.spec->layout);
  const detail::TokenStrides ls = detail::lse_strides(a.lse, pr.spec->layout);
  Acc* S = ws.buf[kScores];
  Acc* f = ws.buf[kFactors];
  Acc* o = ws.buf[kOutRow];
  for (std::int64_t h = kvh * pr.group; h < (kvh + 1) * pr.group; ++h) {
    logits(pr, b, h, S, static_cast<Acc*>(nullptr));
    for (std::int64_t i = 0; i < sp.q_len; ++i) {
      const KeyRange r = pr.keys(b, i);
      Acc* p = S + i * sp.kv_len;
      const Acc lse = softmax_row(p, sp.kv_len, r, pr.sinks[h]);
      round_row(pr, p, r);
      a.lse.as<Lse<T>>()[ls.offset(b, sp.q_begin + i, h)] = static_cast<Lse<T>>(lse);
      std::fill_n(o, pr.dv, Acc{0});
      if (pr.dropout) dropout_factors(pr, b, h, i, r, f);
      for (std::int64_t j = r.begin; j < r.end; ++j) {
        // No skip of zero weights: 0 * NaN (a bad v) is NaN for every visible key.
        const Acc w = pr.dropout ? pr.rnd(p[j] * f[j]) : p[j];
        const T* vj = pr.v_row(b, j, kvh);
        for (std::int64_t d = 0; d < pr.dv; ++d) o[d] += w * static_cast<Acc>(vj[d]);
      }
      // out is T, or f32 when a bf16/f16 problem asked for spec.out_dtype = f32 (a partial).
      const auto write = [&](auto* out) {
        using D = std::remove_pointer_t<decltype(out)>;
        for (std::int64_t d = 0; d < pr.dv; ++d) out[d] = static_cast<D>(o[d]);
      };
      const std::int64_t off = os.offset(b, sp.q_begin + i, h);
      if (a.out.dtype == DType::f32)
        write(a.out.as<float>() + off);
      else
        write(a.out.as<T>() + off);
    }
  }
}

template <typename T, typename Acc>
void run_forward(const ForwardArgs& a, bool acc64, bool round_inter) {
  const Problem<T, Acc> pr(a.spec, a.in, round_inter);
  Sizer z;
  const BufferSizes sizes = buffer_sizes(a.spec, Pass::forward, acc64, z);
  const ScratchPlan plan = plan_scratch(a.spec, Pass::forward, acc64);
  // Only packed (thd) tensors have rows outside every sequence; they read 0 / -inf.
  if (a.out.dtype == DType::f32)
    fill_view(a.out, 0.0f);
  else
    fill_view(a.out, T(0.0f));
  fill_view(a.lse, static_cast<Lse<T>>(kNegInf));
  const Workers workers(a.workspace, plan.worker_bytes, planned_workers(a.spec, pr.B * pr.Hkv));
  parallel_tasks(pr.B * pr.Hkv, workers, [&](std::int64_t t, std::byte* mem) {
    forward_task(pr, a, t / pr.Hkv, t % pr.Hkv, WorkerScratch<Acc>(mem, sizes));
  });
}

}  // namespace
}  // namespace impl

using namespace impl;

ScratchPlan plan_scratch(const AttentionSpec& spec, Pass pass, bool accumulate_f64) {
  Sizer z;
  const BufferSizes sizes = buffer_sizes(spec, pass, accumulate_f64, z);
  ScratchPlan plan;
  for (int i = 0; i < kNumBufs; ++i) {
    plan.worker_bytes = z.add(plan.worker_bytes, sizes.bytes[i]);
    if (i < kNumScoreBufs) plan.score_bytes = z.add(plan.score_bytes, sizes.bytes[i]);
  }
  // Backward's dbias pass has one task per dbias slice, at most B*H of them.
  const std::int64_t heads = pass == Pass::forward ? spec.heads_kv : spec.heads_q;
  plan.max_tasks =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(z.mul(nonneg(spec.batch), nonneg(heads))));
  plan.overflow = z.overflow;
  return plan;
}

std::int64_t planned_workers(const AttentionSpec& s, std::int64_t tasks) {
  // A thread team costs more than a small problem (and stalls badly when the
  // machine is loaded); 2^17 multiply-adds is roughly where it starts to pay.
  constexpr double kMinParallelWork = 1 << 17;
  const double work = static_cast<double>(s.batch) * static_cast<double>(s.heads_q) *
                      static_cast<double>(s.seqlen_q) * static_cast<double>(s.seqlen_kv) *
                      static_cast<double>(s.head_dim_qk + s.head_dim_v);
  const std::int64_t threads = work < kMinParallelWork ? 1 : omp_get_max_threads();
  return std::max<std::int64_t>(1, std::min<std::int64_t>(threads, tasks));
}

std::size_t workspace_for(const ScratchPlan& plan, std::int64_t workers) {
  Sizer z;
  const std::size_t bytes = z.add(z.mul(plan.worker_bytes, nonneg(workers)), kAlign);
  return z.overflow ? std::numeric_limits<std::size_t>::max() : bytes;
}

void forward(const ForwardArgs& args, bool accumulate_f64, bool round_intermediates) {
  guard_alloc([&] {
    dispatch_dtype(args.spec.dtype, accumulate_f64, [&](auto t, auto acc) {
      run_forward<decltype(t), decltype(acc)>(args, std::is_same_v<decltype(acc), double>, round_intermediates);
    });
  });
}

}  // namespace attend::reference
