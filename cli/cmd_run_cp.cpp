// attend run --cp N (under mpirun -np N): every rank builds the whole problem
// from the same seed, keeps its rows, runs the context-parallel forward (and
// backward), and rank 0 gathers the results and checks them against the
// single-process f64 reference.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include "attend/parallel_mpi.h"
#include "check.h"
#include "commands.h"
#include "parallel/shard_grid.h"
#include "runtime/flops.h"

namespace attend_cli {

namespace {

namespace par = attend::parallel;
using attend::parallel::detail::copy_block;
using attend::parallel::detail::Grid;
using attend::parallel::detail::grid;
using attend::parallel::detail::lse_grid;

Grid as_grid(const attend::TensorView& t, bool lse) { return lse ? lse_grid(t) : grid(t); }

// This rank's rows of a whole (B, S, H, D) tensor or (B, H, S) LSE.
attend::Tensor shard(const par::Plan& plan, const attend::Tensor& whole, bool lse = false) {
  if (!whole.defined()) return whole;
  const attend::TensorView& w = whole.view();
  const std::int64_t rows = plan.local_spec().seqlen_q;
  const attend::Tensor t = lse ? attend::Tensor::zeros(w.dtype, {w.shape[0], w.shape[1], rows})
                               : attend::Tensor::zeros(w.dtype, {w.shape[0], rows, w.shape[2], w.shape[3]});
  const Grid src = as_grid(w, lse), dst = as_grid(t, lse);
  std::int64_t row = 0;
  for (const par::Chunk& c : plan.local_chunks()) {
    copy_block(src, c.offset, 0, dst, row, 0, c.rows, src.n[2]);
    row += c.rows;
  }
  return t;
}

// Every rank's rows of `local` assembled on rank 0 (undefined elsewhere).
attend::Tensor gather(const par::Plan& plan, const attend::Tensor& local, bool lse = false) {
  const attend::TensorView& l = local.view();
  const int n = plan.config.size;
  const std::size_t bytes = static_cast<std::size_t>(local.numel()) * attend::size_of(l.dtype);
  const bool root = plan.config.rank == 0;
  // MPI_Gather places rank r's bytes at r * bytes.
  const attend::Tensor all =
      attend::Tensor::zeros(attend::DType::i32, {root ? n : 1, static_cast<std::int64_t>(bytes / 4 + 1)});
  const int count = static_cast<int>(bytes);
  MPI_Gather(local.data(), count, MPI_BYTE, all.data(), count, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (!root) return {};
  const std::int64_t whole_rows = plan.spec.seqlen_q;
  const attend::Tensor out = lse ? attend::Tensor::zeros(l.dtype, {l.shape[0], l.shape[1], whole_rows})
                                 : attend::Tensor::zeros(l.dtype, {l.shape[0], whole_rows, l.shape[2], l.shape[3]});
  const Grid dst = as_grid(out, lse);
  for (int r = 0; r < n; ++r) {
    attend::TensorView part = l;
    part.data = static_cast<std::byte*>(all.data()) + static_cast<std::size_t>(r) * bytes;
    const Grid src = as_grid(part, lse);
    std::int64_t row = 0;
    for (const par::Chunk& c : plan.local_chunks(r)) {
      copy_block(src, row, 0, dst, c.offset, 0, c.rows, src.n[2]);
      row += c.rows;
    }
  }
  return out;
}

// Slowest rank's time of fn() (the job's time), in seconds.
template <class Fn>
double timed(Fn&& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  fn();
  double mine = MPI_Wtime() - t0, slowest = 0.0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

struct MpiSession {
  bool owned = false;
  MpiSession() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      MPI_Init(nullptr, nullptr);
      owned = true;
    }
  }
  ~MpiSession() {
    if (owned) MPI_Finalize();
  }
};

std::string ms_text(const char* pass, double seconds, double flops) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s: %.3f ms  %.2f GFLOP/s (slowest rank)", pass, seconds * 1e3,
                seconds > 0 ? flops / seconds / 1e9 : 0.0);
  return buf;
}

}  // namespace

static int run_cp_ranks(RunCommand& cmd) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Every rank sees the same size: all fail alike, before any collective.
  if (size != cmd.cp.size) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--cp", std::to_string(cmd.cp.size),
                        "mpirun started " + std::to_string(size) + " ranks; run mpirun -np " +
                            std::to_string(cmd.cp.size) + " attend run --cp " + std::to_string(cmd.cp.size));
  }
  if (!cmd.q_path.empty() || !cmd.save_dir.empty() || cmd.json || cmd.repeat != 1) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--cp", std::to_string(cmd.cp.size),
                        "--q/--k/--v, --save, --json and --repeat are not available with --cp");
  }
  const Problem p = make_problem(cmd.problem);
  const bool training = p.mode == attend::Mode::training;
  // Fails early, on every rank, when the forced strategy (or every one) cannot run.
  const par::Plan plan = par::plan(p.spec, p.mode, cmd.cp.config(rank), p.policy);
  DataSources src;
  src.seed = cmd.data_seed;
  src.need_dout = training;
  const ProblemData data = make_data(p, src);  // the whole problem, the same on every rank

  attend::Inputs in = data.inputs();
  const attend::Tensor q = shard(plan, data.q), k = shard(plan, data.k), v = shard(plan, data.v);
  in.q = q;
  in.k = k;
  in.v = v;
  const attend::AttentionSpec ls = plan.local_spec();
  const attend::Tensor out = zeros(attend::expected_dtype(ls, attend::Role::out), out_shape(ls));
  const attend::Tensor lse = zeros(ls.lse_dtype(), lse_shape(ls));
  par::RunOptions opt;
  opt.policy = &p.policy;
  opt.timeout_seconds = cmd.cp.timeout;
  const std::int64_t pairs = attend::detail::visible_pairs(p.spec, data.inputs());
  if (rank == 0) {
    std::cout << "problem: " << attend::describe(p.spec) << "\n"
              << "mode: " << describe_mode(p.mode) << "\n"
              << "cp: " << size << " ranks, strategy " << par::to_string(plan.strategy) << ", "
              << (plan.balanced ? "balanced causal (zigzag)" : "contiguous") << " sharding, "
              << plan.local_spec().seqlen_q << " rows per rank\n";
  }
  const double t_fwd = timed([&] { par::forward(MPI_COMM_WORLD, plan, in, out, lse, opt); });
  if (rank == 0)
    std::cout << ms_text("forward", t_fwd, static_cast<double>(attend::detail::forward_flops(p.spec, pairs))) << "\n";
  attend::ForwardResult fwd;
  fwd.out = gather(plan, out);
  fwd.lse = gather(plan, lse, true);
  attend::Gradients grads;
  if (training) {
    const attend::Tensor dout = shard(plan, data.dout);
    const attend::Tensor dq = zeros(attend::expected_dtype(ls, attend::Role::dq), q_shape(ls));
    const attend::Tensor dk = attend::Tensor::zeros_like(k), dv = attend::Tensor::zeros_like(v);
    // Every rank receives the whole (H) sink gradient, summed over ranks.
    const attend::Tensor dsinks = data.sinks.defined() && p.spec.softmax_type == attend::SoftmaxType::learnable
                                      ? attend::Tensor::zeros_like(data.sinks)
                                      : attend::Tensor{};
    attend::GradViews gv{dq, dk, dv};
    if (dsinks.defined()) gv.dsinks = dsinks;
    const double t_bwd = timed([&] { par::backward(MPI_COMM_WORLD, plan, in, out, lse, dout, gv, opt); });
    if (rank == 0)
      std::cout << ms_text("backward", t_bwd, static_cast<double>(attend::detail::backward_flops(p.spec, pairs)))
                << "\n";
    grads.dq = gather(plan, dq);
    grads.dk = gather(plan, dk);
    grads.dv = gather(plan, dv);
    grads.dsinks = dsinks;
  }
  int code = 0;
  if (cmd.check && rank == 0) {
    const double tol = cmd.tolerance > 0.0 ? cmd.tolerance : default_tolerance(p.spec.dtype);
    bool ok = true;
    for (const ErrorStats& st : check_against_reference(p, data, fwd, training ? &grads : nullptr)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "max_abs_err=%.3e max_rel_err=%.3e", st.max_abs_err, st.max_rel_err);
      std::cout << "check " << st.name << ": " << buf << "\n";
      ok = ok && st.max_rel_err <= tol;  // false for NaN
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, " (max_rel_err tolerance %.1e)", tol);
    std::cout << "check: " << (ok ? "ok" : "FAILED") << buf << "\n";
    code = ok ? 0 : kExitCheckFailed;
  }
  // Every rank exits with rank 0's verdict, so mpirun's status is the check's.
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return code;
}

// Once one rank exits non-zero, mpirun kills the rest, and output they wrote
// but mpirun had not yet forwarded may be lost (seen under load: one rank's
// message missing). A bounded barrier after printing lets every rank that is
// failing too print first; a rank that never arrives (an error it did not
// share) costs at most the bound, never a hang.
static void wait_for_the_others() {
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int run_cp(RunCommand& cmd) {
  const MpiSession mpi;
  try {
    return run_cp_ranks(cmd);
  } catch (const attend::Error& e) {
    // Printed before MPI_Finalize, which Open MPI fences across ranks: once one
    // rank exits non-zero mpirun kills the rest, and a rank that had not yet
    // printed its (identical, agreed) error would end silently.
    std::cerr << "error: " << e.what() << std::endl;
    wait_for_the_others();
    return kExitError;
  }
}

}  // namespace attend_cli
