// Context parallelism over MPI, run under mpirun with 2, 3 and 4 ranks: each
// strategy that accepts a problem gives every rank's rows of out, lse, dq,
// dk and dv equal to the single-process float64 reference of the whole
// problem; and failures on one rank reach every rank as attend::Error naming
// it, with the caller's outputs untouched.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "attend/parallel_mpi.h"
#include "parallel/mpi_link.h"
#include "parallel/shard_grid.h"
#include "support/tensors.h"

namespace attend::parallel {
namespace {

using attend::testing::make_problem;
using attend::testing::max_abs_diff;
using attend::testing::PassResults;
using attend::testing::Problem;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// This rank's rows (its chunks, in order) of a whole bshd tensor or LSE.
Tensor shard(const Plan& plan, const TensorView& whole, bool lse = false) {
  const AttentionSpec ls = plan.local_spec();
  TensorView shape = whole;
  shape.shape[lse ? 2 : 1] = ls.seqlen_q;
  Tensor t = Tensor::zeros(whole.dtype, {shape.shape[0], shape.shape[1], shape.shape[2], lse ? 1 : shape.shape[3]});
  if (lse) t = Tensor::zeros(whole.dtype, {shape.shape[0], shape.shape[1], shape.shape[2]});
  std::int64_t row = 0;
  for (const Chunk& c : plan.local_chunks()) {
    if (lse) {
      detail::copy_block(detail::lse_grid(whole), c.offset, 0, detail::lse_grid(t), row, 0, c.rows, whole.shape[1]);
    } else {
      detail::copy_block(detail::grid(whole), c.offset, 0, detail::grid(t), row, 0, c.rows, whole.shape[2]);
    }
    row += c.rows;
  }
  return t;
}

struct Case {
  const char* name;
  std::int64_t heads_q, heads_kv, dim_qk, dim_v, seq_per_rank;
  bool causal = false, alibi = false;
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0.0, dropout = 0.0;
  DType dtype = DType::f32;
  SoftmaxType softmax = SoftmaxType::vanilla;
};

AttentionSpec spec_of(const Case& c, int n) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = s.seqlen_kv = c.seq_per_rank * n;
  s.heads_q = c.heads_q;
  s.heads_kv = c.heads_kv;
  s.head_dim_qk = c.dim_qk;
  s.head_dim_v = c.dim_v;
  s.causal = c.causal;
  s.alibi = c.alibi;
  s.window_left = c.window_left;
  s.window_right = c.window_right;
  s.softcap = c.softcap;
  s.dtype = c.dtype;
  s.softmax_type = c.softmax;
  if (c.dropout > 0) {
    s.dropout_p = c.dropout;
    s.dropout_seed = 99;
  }
  return s;
}

class CpMatchesSingleProcess : public ::testing::TestWithParam<Case> {};

TEST_P(CpMatchesSingleProcess, EveryRankRowsOfOutputAndGradientsEqualTheReference) {
  const Case& c = GetParam();
  const int n = world_size(), rank = world_rank();
  const AttentionSpec whole = spec_of(c, n);
  const Problem p = make_problem(whole, 21);
  const PassResults want =
      attend::testing::run_backend(*make_reference_backend(), attend::testing::problem_as_f64(p), true);
  // f32: the same-precision bound of test_partials; bf16: its rounding.
  const double tol = c.dtype == DType::f32 ? 5e-5 : 3e-2;
  int ran = 0;
  for (Strategy strategy : {Strategy::ring, Strategy::a2a}) {
    const Plan plan = evaluate(whole, Mode::training, {n, rank, strategy});
    if (!plan.viable()) {
      EXPECT_NE(strategy, Strategy::ring) << plan.explain();  // every case here is a ring case
      continue;
    }
    ++ran;
    SCOPED_TRACE(std::string(to_string(strategy)) + " rank " + std::to_string(rank) + "/" + std::to_string(n));
    Inputs in = p.inputs;
    const Tensor q = shard(plan, p.q), k = shard(plan, p.k), v = shard(plan, p.v), dout = shard(plan, p.dout);
    in.q = q;
    in.k = k;
    in.v = v;
    const AttentionSpec ls = plan.local_spec();
    Tensor out = Tensor::zeros(ls.dtype, {ls.batch, ls.seqlen_q, ls.heads_q, ls.head_dim_v});
    Tensor lse = Tensor::zeros(ls.lse_dtype(), {ls.batch, ls.heads_q, ls.seqlen_q});
    forward(MPI_COMM_WORLD, plan, in, out, lse);
    EXPECT_LE(max_abs_diff(out, shard(plan, want.out)), tol) << "out";
    EXPECT_LE(max_abs_diff(lse, shard(plan, want.lse, true)), tol) << "lse";
    Tensor dq = Tensor::zeros_like(q), dk = Tensor::zeros_like(k), dv = Tensor::zeros_like(v);
    GradViews g{dq, dk, dv};
    Tensor dsinks;
    if (c.softmax == SoftmaxType::learnable) {
      dsinks = Tensor::zeros_like(p.sinks);
      g.dsinks = dsinks;
    }
    backward(MPI_COMM_WORLD, plan, in, out, lse, dout, g);
    EXPECT_LE(max_abs_diff(dq, shard(plan, want.dq)), 4 * tol) << "dq";
    EXPECT_LE(max_abs_diff(dk, shard(plan, want.dk)), 4 * tol) << "dk";
    EXPECT_LE(max_abs_diff(dv, shard(plan, want.dv)), 4 * tol) << "dv";
    // Every rank holds the whole (H) gradient, summed over all rows.
    if (dsinks.defined()) {
      EXPECT_LE(max_abs_diff(dsinks, want.dsinks), 4 * tol) << "dsinks";
    }
  }
  const bool a2a_applies = c.heads_q % n == 0 && c.heads_kv % n == 0 && c.dropout == 0.0;
  EXPECT_EQ(ran, a2a_applies ? 2 : 1);
}

// seq_per_rank 12: 2*cp chunks of 6 rows for causal problems at any cp.
INSTANTIATE_TEST_SUITE_P(
    Cases, CpMatchesSingleProcess,
    ::testing::Values(Case{"plain_gqa", 12, 4, 16, 16, 12}, Case{"causal_balanced", 12, 12, 16, 16, 12, true},
                      Case{"causal_gqa", 12, 4, 16, 16, 12, true},
                      Case{"sliding_window", 4, 2, 16, 16, 12, false, false, 9, 4},
                      Case{"causal_window", 4, 4, 16, 16, 12, true, false, 7},
                      Case{"dims_192_128", 4, 4, 192, 128, 12, true},
                      Case{"softcap_alibi", 12, 6, 16, 16, 12, true, true, -1, -1, 5.0},
                      Case{"dropout_causal", 4, 2, 16, 16, 12, true, false, -1, -1, 0.0, 0.25},
                      Case{"bf16_causal", 12, 12, 32, 32, 12, true, false, -1, -1, 0.0, 0.0, DType::bf16},
                      // Sinks: the window hides key chunk 0 from the far chunks, whose
                      // carrying blocks must still run.
                      Case{"sinks_learnable_causal_gqa", 12, 4, 16, 16, 12, true, false, -1, -1, 0.0, 0.0, DType::f32,
                           SoftmaxType::learnable},
                      Case{"sinks_learnable_window", 4, 2, 16, 16, 12, false, false, 9, 4, 0.0, 0.0, DType::f32,
                           SoftmaxType::learnable},
                      Case{"sinks_off_by_one_causal_window", 4, 4, 16, 16, 12, true, false, 7, -1, 0.0, 0.0, DType::f32,
                           SoftmaxType::off_by_one},
                      Case{"sinks_learnable_plain", 12, 12, 16, 16, 12, false, false, -1, -1, 0.0, 0.0, DType::f32,
                           SoftmaxType::learnable}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

// --- faults ------------------------------------------------------------------

struct Sharded {
  Plan plan;
  Problem p;
  Tensor q, k, v, out, lse;
  Inputs in;
};

Sharded sharded_problem(AttentionSpec s, Strategy strategy) {
  const int n = world_size();
  Sharded r{evaluate(s, Mode::training, {n, world_rank(), strategy}), make_problem(s, 5), {}, {}, {}, {}, {}, {}};
  r.q = shard(r.plan, r.p.q);
  r.k = shard(r.plan, r.p.k);
  r.v = shard(r.plan, r.p.v);
  r.in = r.p.inputs;
  r.in.q = r.q;
  r.in.k = r.k;
  r.in.v = r.v;
  const AttentionSpec ls = r.plan.local_spec();
  r.out = Tensor::zeros(ls.dtype, {ls.batch, ls.seqlen_q, ls.heads_q, ls.head_dim_v});
  r.lse = Tensor::zeros(ls.lse_dtype(), {ls.batch, ls.heads_q, ls.seqlen_q});
  for (std::int64_t i = 0; i < r.out.numel(); ++i) r.out.as<float>()[i] = 7.0f;  // must stay untouched
  return r;
}

bool all_sevens(const Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (t.as<float>()[i] != 7.0f) return false;
  }
  return true;
}

AttentionSpec fault_spec() {
  AttentionSpec s;
  s.batch = 1;
  s.seqlen_q = s.seqlen_kv = 12 * world_size();
  s.heads_q = s.heads_kv = 12;
  s.head_dim_qk = s.head_dim_v = 16;
  s.causal = true;
  return s;
}

TEST(CpFaults, ARankThatRaisesMidRingFailsEveryRankNamingIt) {
  const int n = world_size(), bad = n - 1;
  for (Strategy strategy : {Strategy::ring, Strategy::a2a}) {
    Sharded s = sharded_problem(fault_spec(), strategy);
    RunOptions opt;
    opt.timeout_seconds = 20;
    // Mid-ring: the second step (all-to-all has one phase, step 0).
    const int fail_step = strategy == Strategy::ring ? std::min(1, n - 1) : 0;
    opt.on_step = [&](int step, Pass) {
      if (world_rank() == bad && step == fail_step) throw std::runtime_error("injected failure");
    };
    try {
      forward(MPI_COMM_WORLD, s.plan, s.in, s.out, s.lse, opt);
      ADD_FAILURE() << "expected attend::Error on rank " << world_rank();
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "cp_rank");
      EXPECT_EQ(e.value(), std::to_string(bad));
      EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(all_sevens(s.out)) << "out was written on failure (" << to_string(strategy) << ")";
  }
}

TEST(CpFaults, ARankWithAMismatchedSpecFailsEveryRank) {
  const int bad = world_size() - 1;
  AttentionSpec spec = fault_spec();
  if (world_rank() == bad) spec.softcap = 3.0;  // same shapes, different problem
  Sharded s = sharded_problem(spec, Strategy::ring);
  try {
    forward(MPI_COMM_WORLD, s.plan, s.in, s.out, s.lse);
    ADD_FAILURE() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "cp_rank");
    EXPECT_EQ(e.value(), std::to_string(bad));
    EXPECT_NE(std::string(e.what()).find("different problem"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(all_sevens(s.out));
}

TEST(CpFaults, AWrongTensorOnOneRankFailsEveryRankNamingIt) {
  Sharded s = sharded_problem(fault_spec(), Strategy::ring);
  Tensor small = Tensor::zeros(DType::f32, {1, 1, 12, 16});
  if (world_rank() == 0) s.in.q = small;
  try {
    forward(MPI_COMM_WORLD, s.plan, s.in, s.out, s.lse);
    ADD_FAILURE() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.value(), "0");
    EXPECT_NE(std::string(e.what()).find("q.shape"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(all_sevens(s.out));
}

TEST(CpFaults, AWorldSizeOtherThanTheCpSizeIsAnErrorOnEveryRank) {
  AttentionSpec spec = fault_spec();
  const int n = world_size() + 1;
  spec.seqlen_q = spec.seqlen_kv = 12 * n;
  const Plan plan = evaluate(spec, Mode::training, {n, world_rank()});
  Tensor q = Tensor::zeros(DType::f32, {1, 12, 12, 16});
  Tensor out = Tensor::zeros(DType::f32, {1, 12, 12, 16}), lse = Tensor::zeros(DType::f32, {1, 12, 12});
  try {
    Inputs in;
    in.q = in.k = in.v = q;
    forward(MPI_COMM_WORLD, plan, in, out, lse);
    ADD_FAILURE() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "cp");
    EXPECT_NE(std::string(e.what()).find("communicator has " + std::to_string(world_size())), std::string::npos);
  }
}

// A peer that never sends is reported, naming it, once the deadline passes:
// no wait of the engines blocks without one.
TEST(CpFaults, APeerThatNeverAnswersIsReportedAfterTheTimeout) {
  static std::int32_t box = 0;  // outlives the abandoned receive until it completes
  const int rank = world_rank(), n = world_size();
  if (rank == 0) {
    const detail::Link link(MPI_COMM_WORLD, 0.5);
    std::vector<MPI_Request> reqs{link.irecv(&box, sizeof box, n - 1, 4242)};
    const auto t0 = MPI_Wtime();
    try {
      link.wait(reqs, n - 1, "test receive");
      ADD_FAILURE() << "expected attend::Error";
    } catch (const Error& e) {
      EXPECT_EQ(e.value(), std::to_string(n - 1));
      EXPECT_NE(std::string(e.what()).find("did not answer within"), std::string::npos) << e.what();
    }
    EXPECT_LT(MPI_Wtime() - t0, 5.0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Late, so that the abandoned receive completes before MPI_Finalize.
  if (rank == n - 1) {
    const std::int32_t late = 1;
    MPI_Send(&late, 1, MPI_INT32_T, 0, 4242, MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace attend::parallel

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // One rank prints the progress; every rank still reports its own failures.
  if (rank != 0) ::testing::GTEST_FLAG(brief) = true;
  const int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
