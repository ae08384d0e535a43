// All-to-all (Ulysses) context parallelism over MPI: an all-to-all turns
// "my rows of every head" into "every row of my heads", attention runs on
// whole sequences locally, and a second all-to-all turns the results back.
// GQA rule: rank r takes query heads [r*H/n, (r+1)*H/n) and key/value heads
// [r*Hkv/n, (r+1)*Hkv/n), which are exactly the heads its queries read.
#include "attend/plan.h"
#include "parallel/mpi_engines.h"
#include "parallel/shard_grid.h"

namespace attend::parallel::detail {

namespace {

std::int64_t block_bytes(const Grid& g, std::int64_t rows, std::int64_t heads) {
  return g.n[0] * rows * heads * g.n[3] * static_cast<std::int64_t>(size_of(g.dtype));
}

void exchange(const Job& job, const Tensor& send, const Tensor& recv, std::int64_t bytes, const char* what) {
  const Stopwatch sw(job.stats.wait_seconds);
  std::vector<MPI_Request> reqs{job.link.ialltoall(send.data(), recv.data(), static_cast<std::size_t>(bytes))};
  job.link.wait(reqs, -1, what);
}

// local (B, L, Hx, D) on every rank -> full (B, S, Hx/n, D): this rank's heads, every row.
void seq_to_heads(const Job& job, const Grid& local, const Grid& full, const char* what) {
  const int n = job.plan.config.size;
  const std::int64_t L = local.n[1], hl = full.n[2];
  const std::int64_t bytes = block_bytes(local, L, hl);
  Tensor send = Tensor::zeros(DType::i32, {n, bytes / 4 + 1}), recv = Tensor::zeros(DType::i32, {n, bytes / 4 + 1});
  const std::int64_t stride = (bytes / 4 + 1) * 4;
  for (int j = 0; j < n; ++j) {
    const Grid dst =
        packed(static_cast<std::byte*>(send.data()) + j * stride, local.dtype, local.n[0], L, hl, local.n[3]);
    copy_block(local, 0, j * hl, dst, 0, 0, L, hl);
  }
  exchange(job, send, recv, stride, what);
  for (int i = 0; i < n; ++i) {
    const Grid src =
        packed(static_cast<std::byte*>(recv.data()) + i * stride, local.dtype, local.n[0], L, hl, local.n[3]);
    std::int64_t row = 0;
    for (const Chunk& ch : job.plan.local_chunks(i)) {
      copy_block(src, row, 0, full, ch.offset, 0, ch.rows, hl);
      row += ch.rows;
    }
  }
}

// full (B, S, Hx/n, D) of this rank's heads -> local (B, L, Hx, D): every head, my rows.
void heads_to_seq(const Job& job, const Grid& full, const Grid& local, const char* what) {
  const int n = job.plan.config.size;
  const std::int64_t L = local.n[1], hl = full.n[2];
  const std::int64_t bytes = block_bytes(full, L, hl);
  Tensor send = Tensor::zeros(DType::i32, {n, bytes / 4 + 1}), recv = Tensor::zeros(DType::i32, {n, bytes / 4 + 1});
  const std::int64_t stride = (bytes / 4 + 1) * 4;
  for (int i = 0; i < n; ++i) {
    const Grid dst = packed(static_cast<std::byte*>(send.data()) + i * stride, full.dtype, full.n[0], L, hl, full.n[3]);
    std::int64_t row = 0;
    for (const Chunk& ch : job.plan.local_chunks(i)) {
      copy_block(full, ch.offset, 0, dst, row, 0, ch.rows, hl);
      row += ch.rows;
    }
  }
  exchange(job, send, recv, stride, what);
  for (int j = 0; j < n; ++j) {
    const Grid src = packed(static_cast<std::byte*>(recv.data()) + j * stride, full.dtype, full.n[0], L, hl, full.n[3]);
    copy_block(src, 0, 0, local, 0, j * hl, L, hl);
  }
}

Tensor heads_tensor(const AttentionSpec& hs, std::int64_t heads, std::int64_t dim, DType dtype) {
  return Tensor::zeros(dtype, {hs.batch, hs.seqlen_q, heads, dim});
}

// This rank's slice of the ALiBi slopes ((H) or (B, H)).
TensorView slope_slice(const TensorView& slopes, std::int64_t h0, std::int64_t heads) {
  if (!slopes.defined()) return slopes;
  TensorView v = slopes;
  const int d = slopes.ndim - 1;
  v.data =
      static_cast<std::byte*>(slopes.data) + h0 * slopes.strides[d] * static_cast<std::int64_t>(size_of(slopes.dtype));
  v.shape[d] = heads;
  return v;
}

struct HeadInputs {
  AttentionSpec spec;
  Tensor q, k, v;
  Inputs in;
};

HeadInputs gather_inputs(const Job& job, const Inputs& local) {
  HeadInputs h{a2a_spec(job.plan), {}, {}, {}, local};
  const AttentionSpec& s = h.spec;
  h.q = heads_tensor(s, s.heads_q, s.head_dim_qk, s.dtype);
  h.k = heads_tensor(s, s.heads_kv, s.head_dim_qk, s.dtype);
  h.v = heads_tensor(s, s.heads_kv, s.head_dim_v, s.dtype);
  seq_to_heads(job, grid(local.q), grid(h.q), "all-to-all of q");
  seq_to_heads(job, grid(local.k), grid(h.k), "all-to-all of k");
  seq_to_heads(job, grid(local.v), grid(h.v), "all-to-all of v");
  h.in.q = h.q;
  h.in.k = h.k;
  h.in.v = h.v;
  h.in.alibi_slopes = slope_slice(local.alibi_slopes, job.plan.config.rank * s.heads_q, s.heads_q);
  h.in.sinks = slope_slice(local.sinks, job.plan.config.rank * s.heads_q, s.heads_q);
  return h;
}

}  // namespace

Tensor zero_dsinks(const AttentionSpec& spec) {
  if (spec.softmax_type != SoftmaxType::learnable) return {};
  return Tensor::zeros(spec.lse_dtype(), {spec.heads_q});
}

void sum_dsinks(const Job& job, const Tensor& dsinks) {
  if (!dsinks.defined()) return;
  const Stopwatch sw(job.stats.wait_seconds);
  std::vector<MPI_Request> reqs{
      job.link.iallreduce_sum(dsinks.data(), dsinks.numel(), dsinks.view().dtype == DType::f64)};
  job.link.wait(reqs, -1, "allreduce of dsinks");
}

LocalForward a2a_forward(const Job& job, const Inputs& local) {
  guarded(job.failure, [&] {
    if (job.options.on_step) job.options.on_step(0, Pass::forward);
  });
  HeadInputs h = gather_inputs(job, local);
  const AttentionSpec& s = h.spec;
  Tensor out = heads_tensor(s, s.heads_q, s.head_dim_v, s.effective_out_dtype());
  Tensor lse = Tensor::zeros(s.lse_dtype(), {s.batch, s.heads_q, s.seqlen_q});
  guarded(job.failure, [&] {
    const Stopwatch sw(job.stats.compute_seconds);
    ++job.stats.blocks;
    attend::Plan::make(s, Mode::inference, {&job.policy, {}}).forward(h.in, out, lse);
  });
  const AttentionSpec ls = job.plan.local_spec();
  LocalForward r{Tensor::zeros(out.view().dtype, {ls.batch, ls.seqlen_q, ls.heads_q, ls.head_dim_v}),
                 Tensor::zeros(ls.lse_dtype(), {ls.batch, ls.heads_q, ls.seqlen_q})};
  heads_to_seq(job, grid(out), grid(r.out), "all-to-all of out");
  heads_to_seq(job, lse_grid(lse), lse_grid(r.lse), "all-to-all of lse");
  return r;
}

LocalGrads a2a_backward(const Job& job, const Inputs& local, const TensorView& out, const TensorView& lse,
                        const TensorView& dout) {
  guarded(job.failure, [&] {
    if (job.options.on_step) job.options.on_step(0, Pass::backward);
  });
  HeadInputs h = gather_inputs(job, local);
  const AttentionSpec& s = h.spec;
  Tensor o = heads_tensor(s, s.heads_q, s.head_dim_v, out.dtype);
  Tensor d = heads_tensor(s, s.heads_q, s.head_dim_v, dout.dtype);
  Tensor l = Tensor::zeros(lse.dtype, {s.batch, s.heads_q, s.seqlen_q});
  seq_to_heads(job, grid(out), grid(o), "all-to-all of out");
  seq_to_heads(job, grid(dout), grid(d), "all-to-all of dout");
  seq_to_heads(job, lse_grid(lse), lse_grid(l), "all-to-all of lse");
  Tensor dq = heads_tensor(s, s.heads_q, s.head_dim_qk, s.effective_dq_dtype());
  Tensor dk = Tensor::zeros_like(h.k), dv = Tensor::zeros_like(h.v);
  // Each rank writes its heads' slice of the whole (H) gradient; the sum over
  // ranks then gathers every slice.
  const Tensor dsinks = zero_dsinks(job.plan.spec);
  guarded(job.failure, [&] {
    const Stopwatch sw(job.stats.compute_seconds);
    ++job.stats.blocks;
    GradViews g{dq, dk, dv};
    if (dsinks.defined()) g.dsinks = slope_slice(dsinks, job.plan.config.rank * s.heads_q, s.heads_q);
    attend::Plan::make(s, Mode::training, {&job.policy, {}}).backward(h.in, o, l, d, g);
  });
  sum_dsinks(job, dsinks);
  const AttentionSpec ls = job.plan.local_spec();
  LocalGrads g{Tensor::zeros(dq.view().dtype, {ls.batch, ls.seqlen_q, ls.heads_q, ls.head_dim_qk}),
               Tensor::zeros(s.dtype, {ls.batch, ls.seqlen_kv, ls.heads_kv, ls.head_dim_qk}),
               Tensor::zeros(s.dtype, {ls.batch, ls.seqlen_kv, ls.heads_kv, ls.head_dim_v}), dsinks};
  heads_to_seq(job, grid(dq), grid(g.dq), "all-to-all of dq");
  heads_to_seq(job, grid(dk), grid(g.dk), "all-to-all of dk");
  heads_to_seq(job, grid(dv), grid(g.dv), "all-to-all of dv");
  return g;
}

}  // namespace attend::parallel::detail
