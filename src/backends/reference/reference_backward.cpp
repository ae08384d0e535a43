// The reference backward pass: dQ, dK, dV and dbias from a recomputed softmax.
#include "backends/reference/reference_common.h"
#include "backends/reference/reference_kernels.h"

namespace attend::reference {
namespace impl {
namespace {

// ds[r] <- dL/ds_ij for row i of (b, h) given its probabilities p. With
// dropout, P' = P*f, dP'_ij = dO_i.v_j and dP = dP'*f. D_i = rowsum(dO_i * O_i):
// `forward_D` when the block is part of a bigger row (forward_row), else
// D_i = sum_j P'_ij dP'_ij formed from the recomputed P' rather than the
// stored O, so that f32 rounding of O cannot leak into the oracle.
// dv_acc (optional) accumulates P'^T dO for the kv head.
// Returns D_i (the sink logit's gradient needs it too).
template <typename T, typename Acc>
Acc score_grad_row(const Problem<T, Acc>& pr, std::int64_t b, std::int64_t h, std::int64_t i, KeyRange r, const Acc* p,
                   const T* dO, const Acc* forward_D, Acc* f, Acc* ds, Acc* dv_acc) {
  const std::int64_t kvh = h / pr.group;
  if (pr.dropout) dropout_factors(pr, b, h, i, r, f);
  Acc D = 0;
  for (std::int64_t j = r.begin; j < r.end; ++j) {
    const T* vj = pr.v_row(b, j, kvh);
    const Acc dpd = pr.rnd(dot<Acc>(dO, vj, pr.dv));
    const Acc pd = pr.dropout ? pr.rnd(p[j] * f[j]) : p[j];
    D += pd * dpd;
    ds[j] = pr.dropout ? dpd * f[j] : dpd;
    if (dv_acc != nullptr) {  // zero weights too: 0 * NaN (a bad dO) is NaN
      Acc* dvj = dv_acc + j * pr.dv;
      for (std::int64_t d = 0; d < pr.dv; ++d) dvj[d] += pd * static_cast<Acc>(dO[d]);
    }
  }
  D = forward_D ? *forward_D : pr.rnd(D);
  // A D that is not finite is NaN (see flash's nonfinite_tile.h): the row was
  // reached by a NaN or an infinity, and all its dS are NaN on every backend.
  if (!std::isfinite(D)) D = std::numeric_limits<Acc>::quiet_NaN();
  for (std::int64_t j = r.begin; j < r.end; ++j) ds[j] = pr.rnd(p[j] * (ds[j] - D));
  return D;
}

// Row i of (b, h) as forward saw it. p holds this block's logits and becomes
// its probabilities. Forward's LSE decides: when this block's own LSE rounds
// to it, the block is the whole row (up to the LSE's precision) and keeps its
// exact statistics (*use_D = false); otherwise the block is part of a bigger
// row (offsets, a ring step) and p is rescaled to forward's LSE, with
// D = rowsum(dO * O) from forward's O. False: no key of this row is in the
// block, or forward's LSE says the whole row is empty. p_sink receives the
// sink's probability exp(z_h - LSE) (0 without a sink).
template <typename T, typename Acc>
bool forward_row(const Problem<T, Acc>& pr, const BackwardArgs& a, const detail::TokenStrides& os,
                 const detail::TokenStrides& ls, std::int64_t b, std::int64_t h, std::int64_t row, KeyRange r, Acc* p,
                 std::int64_t sk, const T* dO, Acc& D, bool& use_D, Acc& p_sink) {
  const Acc local = softmax_row(p, sk, r, pr.sinks[h], &p_sink);
  const Lse<T> stored = a.lse.as<const Lse<T>>()[ls.offset(b, row, h)];
  if (local == static_cast<Acc>(kNegInf) || stored == static_cast<Lse<T>>(kNegInf)) {
    p_sink = 0;
    return false;
  }
  use_D = static_cast<Lse<T>>(local) != stored;
  if (use_D) {
    const Acc scale = std::exp(local - static_cast<Acc>(stored));
    for (std::int64_t j = r.begin; j < r.end; ++j) p[j] *= scale;
    p_sink *= scale;
    D = pr.rnd(dot<Acc>(dO, a.out.as<const T>() + os.offset(b, row, h), pr.dv));
  }
  round_row(pr, p, r);
  return true;
}

template <typename T, typename Acc>
struct BackwardCtx {
  const Problem<T, Acc>& pr;
  const BackwardArgs& a;
  detail::TokenStrides dos, dqs, dks, dvs, os, ls;
  detail::BiasStrides dbs;
  bool dbias_direct = false;  // every dbias slice has exactly one (b, h) contributor
  bool accumulate = false;    // spec.accumulate_grads: add into dq/dk/dv
  // softmax_type = learnable: per (b, h), -sum_i p_sink(i) * D_i, summed over b
  // in order after the tasks (each task owns its (b, group) entries).
  Acc* dsink_parts = nullptr;
};

// Pass 1, task (b, kv head): dQ for the group's query heads, dK/dV summed over
// the group in head order, and dbias when it is not broadcast.
template <typename T, typename Acc>
void backward_task(const BackwardCtx<T, Acc>& c, std::int64_t b, std::int64_t kvh, WorkerScratch<Acc> ws) {
  const Problem<T, Acc>& pr = c.pr;
  const detail::SeqSpan& sp = pr.spans[b];
  const std::int64_t sk = sp.kv_len;
  Acc *S = ws.buf[kScores], *tn = ws.buf[kTanh], *ds = ws.buf[kRowGrad], *dq = ws.buf[kOutRow];
  Acc *dk_acc = ws.buf[kDkAcc], *dv_acc = ws.buf[kDvAcc];
  std::fill_n(dk_acc, sk * pr.dqk, Acc{0});
  std::fill_n(dv_acc, sk * pr.dv, Acc{0});
  for (std::int64_t h = kvh * pr.group; h < (kvh + 1) * pr.group; ++h) {
    logits(pr, b, h, S, pr.softcap > 0 ? tn : nullptr);
    for (std::int64_t i = 0; i < sp.q_len; ++i) {
      const KeyRange r = pr.keys(b, i);
      Acc* p = S + i * sk;
      std::fill_n(dq, pr.dqk, Acc{0});
      const std::int64_t row = sp.q_begin + i;
      const T* dO = c.a.dout.template as<const T>() + c.dos.offset(b, row, h);
      Acc D = 0, p_sink = 0;
      bool use_D = false;
      if (forward_row(pr, c.a, c.os, c.ls, b, h, row, r, p, sk, dO, D, use_D, p_sink)) {
        const Acc row_D = score_grad_row(pr, b, h, i, r, p, dO, use_D ? &D : nullptr, ws.buf[kFactors], ds, dv_acc);
        // dL/dz = sum_j dP_j dP_j/dz = -p_sink * sum_j P'_j dP'_j = -p_sink * D.
        if (c.dsink_parts && p_sink != Acc{0}) c.dsink_parts[b * pr.H + h] -= p_sink * row_D;
        if (c.dbias_direct) {
          T* db = c.a.dbias.template as<T>() + c.dbs.offset(b, h, i);
          for (std::int64_t j = r.begin; j < r.end; ++j) db[j] = static_cast<T>(ds[j]);
        }
        // Through softcap: d(c*tanh(x/c))/dx = 1 - t^2.
        if (pr.softcap > 0)
          for (std::int64_t j = r.begin; j < r.end; ++j) ds[j] = pr.rnd(ds[j] * (Acc{1} - tn[i * sk + j] * tn[i * sk + j]));
        const T* qi = pr.q + pr.qs.offset(b, row, h);
        for (std::int64_t j = r.begin; j < r.end; ++j) {  // zeros too: 0 * (NaN or inf in k) is NaN
          const T* kj = pr.k_row(b, j, kvh);
          Acc* dkj = dk_acc + j * pr.dqk;
          const Acc g = pr.scale * ds[j];
          for (std::int64_t d = 0; d < pr.dqk; ++d) {
            dq[d] += ds[j] * static_cast<Acc>(kj[d]);
            dkj[d] += g * static_cast<Acc>(qi[d]);
          }
        }
      }
      // dq is T, or f32 when a bf16/f16 problem asked for spec.dq_dtype = f32.
      const auto write_dq = [&](auto* out) {
        using Dst = std::remove_pointer_t<decltype(out)>;
        for (std::int64_t d = 0; d < pr.dqk; ++d) {
          const Acc x = pr.scale * dq[d];
          out[d] = static_cast<Dst>(c.accumulate ? static_cast<Acc>(out[d]) + x : x);
        }
      };
      const std::int64_t off = c.dqs.offset(b, sp.q_begin + i, h);
      if (c.a.dq.dtype == DType::f32) write_dq(c.a.dq.template as<float>() + off);
      else write_dq(c.a.dq.template as<T>() + off);
    }
  }
  for (std::int64_t j = 0; j < sk; ++j) {
    T* dk = c.a.dk.template as<T>() + c.dks.offset(b, sp.kv_begin + j, kvh);
    T* dv = c.a.dv.template as<T>() + c.dvs.offset(b, sp.kv_begin + j, kvh);
    // Rounded once to T; with spec.accumulate_grads the sum with what was there
    // is (never read otherwise: the memory may be uninitialised).
    for (std::int64_t d = 0; d < pr.dqk; ++d) {
      const Acc x = dk_acc[j * pr.dqk + d];
      dk[d] = static_cast<T>(c.accumulate ? static_cast<Acc>(dk[d]) + x : x);
    }
    for (std::int64_t d = 0; d < pr.dv; ++d) {
      const Acc x = dv_acc[j * pr.dv + d];
      dv[d] = static_cast<T>(c.accumulate ? static_cast<Acc>(dv[d]) + x : x);
    }
  }
}

// Pass 2, task = one slice (bb, hb) of a broadcast dbias: recompute dS for every
// (b, h) that maps onto it, in a fixed order, and sum in the worker's slice.
template <typename T, typename Acc>
void dbias_task(const BackwardCtx<T, Acc>& c, std::int64_t bb, std::int64_t hb, WorkerScratch<Acc> ws) {
  const Problem<T, Acc>& pr = c.pr;
  const TensorView& dbias = c.a.dbias;
  const std::int64_t lq = pr.spec->seqlen_q, lk = pr.spec->seqlen_kv;
  Acc* slice = ws.buf[kBiasSlice];
  std::fill_n(slice, lq * lk, Acc{0});
  const bool all_b = dbias.shape[0] == 1, all_h = dbias.shape[1] == 1;
  for (std::int64_t b = all_b ? 0 : bb; b < (all_b ? pr.B : bb + 1); ++b) {
    const detail::SeqSpan& sp = pr.spans[b];
    for (std::int64_t h = all_h ? 0 : hb; h < (all_h ? pr.H : hb + 1); ++h) {
      Acc* S = ws.buf[kScores];
      logits(pr, b, h, S, static_cast<Acc*>(nullptr));
      for (std::int64_t i = 0; i < sp.q_len; ++i) {
        const KeyRange r = pr.keys(b, i);
        Acc* p = S + i * sp.kv_len;
        const T* dO = c.a.dout.template as<const T>() + c.dos.offset(b, sp.q_begin + i, h);
        Acc D = 0, p_sink = 0;
        bool use_D = false;
        if (!forward_row(pr, c.a, c.os, c.ls, b, h, sp.q_begin + i, r, p, sp.kv_len, dO, D, use_D, p_sink)) continue;
        Acc* ds = ws.buf[kRowGrad];
        score_grad_row(pr, b, h, i, r, p, dO, use_D ? &D : nullptr, ws.buf[kFactors], ds, static_cast<Acc*>(nullptr));
        for (std::int64_t j = r.begin; j < r.end; ++j) slice[i * lk + j] += ds[j];
      }
    }
  }
  for (std::int64_t i = 0; lk > 0 && i < lq; ++i) {  // lk = 0: an empty dbias, any strides
    T* db = dbias.as<T>() + c.dbs.offset(bb, hb, i);
    for (std::int64_t j = 0; j < lk; ++j) db[j] = static_cast<T>(slice[i * lk + j]);
  }
}

template <typename T, typename Acc>
void run_backward(const BackwardArgs& a, bool acc64, bool round_inter) {
  const Problem<T, Acc> pr(a.spec, a.in, round_inter);
  const Layout lay = a.spec.layout;
  BackwardCtx<T, Acc> c{pr,
                        a,
                        detail::token_strides(a.dout, lay),
                        detail::token_strides(a.dq, lay),
                        detail::token_strides(a.dk, lay),
                        detail::token_strides(a.dv, lay),
                        detail::token_strides(a.out, lay),
                        detail::lse_strides(a.lse, lay),
                        {},
                        false,
                        a.spec.accumulate_grads};
  const bool want_dbias = a.spec.has_bias && a.spec.bias_requires_grad && a.dbias.defined();
  std::int64_t slices = 0;
  if (want_dbias) {
    c.dbs = detail::bias_strides(a.dbias);
    c.dbias_direct = a.dbias.shape[0] == pr.B && a.dbias.shape[1] == pr.H;
    slices = a.dbias.shape[0] * a.dbias.shape[1];
    fill_view(a.dbias, T(0.0f));
  }
  Sizer z;
  const BufferSizes sizes = buffer_sizes(a.spec, Pass::backward, acc64, z);
  const ScratchPlan plan = plan_scratch(a.spec, Pass::backward, acc64);
  if (!c.accumulate) {  // rows outside every sequence (thd) read 0
    if (a.dq.dtype == DType::f32)
      fill_view(a.dq, 0.0f);
    else
      fill_view(a.dq, T(0.0f));
    fill_view(a.dk, T(0.0f));
    fill_view(a.dv, T(0.0f));
  }
  std::vector<Acc> dsink_parts;
  if (a.spec.softmax_type == SoftmaxType::learnable) {
    dsink_parts.assign(static_cast<std::size_t>(pr.B * pr.H), Acc{0});
    c.dsink_parts = dsink_parts.data();
  }
  const Workers workers(a.workspace, plan.worker_bytes,
                        planned_workers(a.spec, std::max(pr.B * pr.Hkv, slices)));
  parallel_tasks(pr.B * pr.Hkv, workers, [&](std::int64_t t, std::byte* mem) {
    backward_task(c, t / pr.Hkv, t % pr.Hkv, WorkerScratch<Acc>(mem, sizes));
  });
  if (c.dsink_parts) {
    for (std::int64_t h = 0; h < pr.H; ++h) {
      Lse<T>* dz = a.dsinks.as<Lse<T>>() + h * a.dsinks.strides[0];
      Acc sum = c.accumulate ? static_cast<Acc>(*dz) : Acc{0};
      for (std::int64_t b = 0; b < pr.B; ++b) sum += dsink_parts[b * pr.H + h];
      *dz = static_cast<Lse<T>>(sum);
    }
  }
  if (want_dbias && !c.dbias_direct) {
    const std::int64_t hb = a.dbias.shape[1];
    parallel_tasks(slices, workers, [&](std::int64_t t, std::byte* mem) {
      dbias_task(c, t / hb, t % hb, WorkerScratch<Acc>(mem, sizes));
    });
  }
}

}  // namespace
}  // namespace impl

void backward(const BackwardArgs& args, bool accumulate_f64, bool round_intermediates) {
  using namespace impl;
  guard_alloc([&] {
    dispatch_dtype(args.spec.dtype, accumulate_f64, [&](auto t, auto acc) {
      run_backward<decltype(t), decltype(acc)>(args, std::is_same_v<decltype(acc), double>, round_intermediates);
    });
  });
}

}  // namespace attend::reference
