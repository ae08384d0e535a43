// Context parallelism over MPI: runs an attend::parallel::Plan on the ranks
// of the caller's communicator. Built when CMake finds MPI (target
// attend::parallel_mpi); include <mpi.h> is the caller's too.
//
//   auto plan = attend::parallel::plan(spec, Mode::training, {cp, rank, Strategy::automatic});
//   // q, k, v, dout: this rank's rows, plan.local_chunks() in order, shaped plan.local_spec()
//   attend::parallel::forward(comm, plan, {q, k, v}, out, lse);
//   attend::parallel::backward(comm, plan, {q, k, v}, out, lse, dout, {dq, dk, dv});
//
// Every rank of `comm` calls the same entry point with the same spec and
// config (bar config.rank, which must be its rank in comm, whose size must be
// config.size). Failures are collective: when any rank fails (bad input, a
// kernel error, an exception from RunOptions::on_step, a mismatched spec),
// every rank throws attend::Error naming the failing rank and its message,
// within RunOptions::timeout_seconds even if a rank stops answering, and no
// caller output is written.
#pragma once

#include <mpi.h>

#include <functional>

#include "attend/parallel.h"
#include "attend/plan.h"
#include "attend/tensor.h"

namespace attend::parallel {

// Where a rank's time went in one call (for profiling and the benchmark).
struct RunStats {
  double compute_seconds = 0.0;  // in attention kernels and merges
  double wait_seconds = 0.0;     // blocked on peers: communication not hidden behind compute
  int blocks = 0;                // kernel calls (ring blocks not skipped; 1 for all-to-all)
};

struct RunOptions {
  const Policy* policy = nullptr;  // selection of the local kernels; nullptr: the process-wide policy
  // Longest wait for any peer, in seconds; a peer silent for longer is
  // reported (as rank N timed out) instead of hanging the job.
  double timeout_seconds = 60.0;
  // Called before each ring step's compute (or each all-to-all phase, step 0)
  // with the step index and pass: tracing, progress, fault injection. An
  // exception thrown here is this rank's failure.
  std::function<void(int step, Pass pass)> on_step;
  RunStats* stats = nullptr;  // when set: reset, then filled by the call
};

// Forward of this rank's rows: out (local_spec, spec.effective_out_dtype())
// and lse (B, H, local rows; spec.lse_dtype()) receive its share.
void forward(MPI_Comm comm, const Plan& plan, const Inputs& local, const TensorView& out, const TensorView& lse,
             const RunOptions& options = {});

// Backward from forward's out and lse (this rank's rows) and dout: dq, dk, dv
// of this rank's rows (dk/dv hold the gradient of this rank's keys from every
// rank's queries). plan.mode must be training.
void backward(MPI_Comm comm, const Plan& plan, const Inputs& local, const TensorView& out, const TensorView& lse,
              const TensorView& dout, const GradViews& grads, const RunOptions& options = {});

}  // namespace attend::parallel
