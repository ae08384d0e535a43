// Ring attention over MPI: K/V chunks travel round the ring while each rank
// computes its blocks against the K/V it holds; forward partials merge
// exactly through their LSEs, backward accumulates dQ locally and dK/dV in
// accumulators that travel with (one step behind) their K/V.
#include <cstring>
#include <limits>
#include <utility>

#include "attend/merge.h"
#include "attend/plan.h"
#include "parallel/mpi_engines.h"
#include "parallel/shard_grid.h"

namespace attend::parallel::detail {

namespace {

enum Tag : int { kTagK = 11, kTagV, kTagDK, kTagDV };

std::size_t bytes_of(const Tensor& t) { return static_cast<std::size_t>(t.numel()) * size_of(t.view().dtype); }

// Full-precision dtype of partial results (f64 problems stay f64).
DType acc_dtype(const AttentionSpec& s) { return s.dtype == DType::f64 ? DType::f64 : DType::f32; }

Tensor packed_copy(const TensorView& v) {
  Tensor t = Tensor::zeros(v.dtype, {v.shape[0], v.shape[1], v.shape[2], v.shape[3]});
  copy_block(grid(v), 0, 0, grid(t), 0, 0, v.shape[1], v.shape[2]);
  return t;
}

void fill_minus_inf(const Tensor& lse) {
  const std::int64_t n = lse.numel();
  if (lse.view().dtype == DType::f64) {
    for (std::int64_t i = 0; i < n; ++i) lse.as<double>()[i] = -std::numeric_limits<double>::infinity();
  } else {
    for (std::int64_t i = 0; i < n; ++i) lse.as<float>()[i] = -std::numeric_limits<float>::infinity();
  }
}

// The K/V of the step, double-buffered: one pair is computed on while the
// other receives the next.
struct KvRing {
  Tensor k[2], v[2];
  int cur = 0;

  KvRing(const Inputs& local) {
    k[0] = packed_copy(local.k);
    v[0] = packed_copy(local.v);
    k[1] = Tensor::zeros_like(k[0]);
    v[1] = Tensor::zeros_like(v[0]);
  }
  // Posts the exchange of the current pair for the next.
  void post(const Link& link, const Step& step, std::vector<MPI_Request>& reqs) {
    const int nxt = 1 - cur;
    reqs.push_back(link.irecv(k[nxt].data(), bytes_of(k[nxt]), step.recv_from, kTagK));
    reqs.push_back(link.irecv(v[nxt].data(), bytes_of(v[nxt]), step.recv_from, kTagV));
    reqs.push_back(link.isend(k[cur].data(), bytes_of(k[cur]), step.send_to, kTagK));
    reqs.push_back(link.isend(v[cur].data(), bytes_of(v[cur]), step.send_to, kTagV));
  }
};

}  // namespace

LocalForward ring_forward(const Job& job, const Inputs& local) {
  const Plan& plan = job.plan;
  const AttentionSpec ls = plan.local_spec();
  const std::int64_t c = plan.chunk_rows, L = ls.seqlen_q, B = ls.batch, H = ls.heads_q;
  const DType part = acc_dtype(ls);
  LocalForward acc{Tensor::zeros(part, {B, L, H, ls.head_dim_v}), Tensor::zeros(ls.lse_dtype(), {B, H, L})};
  fill_minus_inf(acc.lse);  // nothing seen yet: weight 0 in the first merge
  Tensor part_out = Tensor::zeros(part, {B, c, H, ls.head_dim_v});
  Tensor part_lse = Tensor::zeros(ls.lse_dtype(), {B, H, c});
  KvRing kv(local);
  const PlanOptions popt{&job.policy, {}};

  const int n = plan.config.size;
  for (const Step& step : plan.steps) {
    std::vector<MPI_Request> reqs;
    if (step.index + 1 < n) kv.post(job.link, step, reqs);
    guarded(job.failure, [&] {
      if (job.options.on_step) job.options.on_step(step.index, Pass::forward);
      for (const Block& b : step.blocks) {
        if (b.mask == BlockMask::skip) continue;
        const AttentionSpec s = block_spec(plan, b, Pass::forward);
        Inputs in = local;
        in.q = row_view(local.q, b.q_chunk * c, c);
        in.k = row_view(kv.k[kv.cur], b.kv_chunk * c, c);
        in.v = row_view(kv.v[kv.cur], b.kv_chunk * c, c);
        if (s.softmax_type != SoftmaxType::learnable) in.sinks = {};
        const Stopwatch sw(job.stats.compute_seconds);
        ++job.stats.blocks;
        attend::Plan::make(s, Mode::inference, popt).forward(in, part_out, part_lse);
        const TensorView o = row_view(acc.out, b.q_chunk * c, c), l = lse_row_view(acc.lse, b.q_chunk * c, c);
        const Partial parts[] = {{o, l}, {part_out, part_lse}};
        merge(s, parts, o, l);
        job.link.poke(reqs);
      }
    });
    const Stopwatch sw(job.stats.wait_seconds);
    job.link.wait(reqs, step.recv_from, "ring forward K/V exchange");
    kv.cur = 1 - kv.cur;
  }
  return acc;
}

LocalGrads ring_backward(const Job& job, const Inputs& local, const TensorView& out, const TensorView& lse,
                         const TensorView& dout) {
  const Plan& plan = job.plan;
  const AttentionSpec ls = plan.local_spec();
  const std::int64_t c = plan.chunk_rows;
  const DType acc = acc_dtype(ls);
  // dQ accumulates over all steps in full precision (dq_dtype = f32 for
  // half problems: the kernel adds into its f32 accumulator unrounded).
  Tensor dq = Tensor::zeros(acc, {ls.batch, ls.seqlen_q, ls.heads_q, ls.head_dim_qk});
  KvRing kv(local);
  Tensor dk_step = Tensor::zeros_like(kv.k[0]), dv_step = Tensor::zeros_like(kv.v[0]);
  Tensor dk_acc[2], dv_acc[2];
  for (int i = 0; i < 2; ++i) {
    dk_acc[i] = Tensor::zeros(acc, {ls.batch, ls.seqlen_kv, ls.heads_kv, ls.head_dim_qk});
    dv_acc[i] = Tensor::zeros(acc, {ls.batch, ls.seqlen_kv, ls.heads_kv, ls.head_dim_v});
  }
  const Tensor dsinks = zero_dsinks(ls);
  const PlanOptions popt{&job.policy, {}};
  std::vector<MPI_Request> acc_recv, acc_send;

  const int n = plan.config.size;
  for (const Step& step : plan.steps) {
    const int t = step.index, a = t % 2;
    std::vector<MPI_Request> reqs;
    if (t + 1 < n) kv.post(job.link, step, reqs);
    std::memset(dk_step.data(), 0, bytes_of(dk_step));
    std::memset(dv_step.data(), 0, bytes_of(dv_step));
    guarded(job.failure, [&] {
      if (job.options.on_step) job.options.on_step(t, Pass::backward);
      for (const Block& b : step.blocks) {
        if (b.mask == BlockMask::skip) continue;
        AttentionSpec s = block_spec(plan, b, Pass::backward);
        if (s.dtype != acc) s.dq_dtype = acc;
        Inputs in = local;
        in.q = row_view(local.q, b.q_chunk * c, c);
        in.k = row_view(kv.k[kv.cur], b.kv_chunk * c, c);
        in.v = row_view(kv.v[kv.cur], b.kv_chunk * c, c);
        GradViews g{row_view(dq, b.q_chunk * c, c), row_view(dk_step, b.kv_chunk * c, c),
                    row_view(dv_step, b.kv_chunk * c, c)};
        // Only the sink-carrying block (key chunk 0) has a sink gradient.
        if (s.softmax_type == SoftmaxType::learnable)
          g.dsinks = dsinks;
        else
          in.sinks = {};
        const Stopwatch sw(job.stats.compute_seconds);
        ++job.stats.blocks;
        attend::Plan::make(s, Mode::training, popt)
            .backward(in, row_view(out, b.q_chunk * c, c), lse_row_view(lse, b.q_chunk * c, c),
                      row_view(dout, b.q_chunk * c, c), g);
        job.link.poke(reqs);
        job.link.poke(acc_recv);
      }
    });
    // This step's K/V owner's accumulator arrived (sent by the previous rank
    // after its own step t-1) while we computed.
    {
      const Stopwatch sw(job.stats.wait_seconds);
      if (t > 0) job.link.wait(acc_recv, step.recv_from, "ring backward dK/dV exchange");
    }
    {
      const Stopwatch sw(job.stats.compute_seconds);
      convert_grid(grid(dk_step), grid(dk_acc[a]), true);
      convert_grid(grid(dv_step), grid(dv_acc[a]), true);
    }
    const Stopwatch sw(job.stats.wait_seconds);
    job.link.wait(acc_send, step.send_to, "ring backward dK/dV send");  // frees dk_acc[1 - a]
    acc_send.push_back(job.link.isend(dk_acc[a].data(), bytes_of(dk_acc[a]), step.send_to, kTagDK));
    acc_send.push_back(job.link.isend(dv_acc[a].data(), bytes_of(dv_acc[a]), step.send_to, kTagDV));
    // After the last step this brings home this rank's own accumulator.
    acc_recv.push_back(job.link.irecv(dk_acc[1 - a].data(), bytes_of(dk_acc[1 - a]), step.recv_from, kTagDK));
    acc_recv.push_back(job.link.irecv(dv_acc[1 - a].data(), bytes_of(dv_acc[1 - a]), step.recv_from, kTagDV));
    job.link.wait(reqs, step.recv_from, "ring backward K/V exchange");
    kv.cur = 1 - kv.cur;
  }
  const int home = n % 2;
  const Step& last = plan.steps.back();
  const Stopwatch sw(job.stats.wait_seconds);
  job.link.wait(acc_recv, last.recv_from, "ring backward dK/dV return");
  job.link.wait(acc_send, last.send_to, "ring backward dK/dV send");
  sum_dsinks(job, dsinks);
  return {dq, dk_acc[home], dv_acc[home], dsinks};
}

}  // namespace attend::parallel::detail
