// The two CP engines over MPI. Each computes this rank's results into
// tensors of its own; the entry points (mpi_entry.cpp) write the caller's
// outputs only after every rank agreed that all succeeded.
//
// A rank whose compute fails records the failure and keeps taking part in
// every exchange (sending whatever its buffers hold), so no peer blocks on it;
// the agreement afterwards raises the failure everywhere.
#pragma once

#include <chrono>

#include "attend/parallel.h"
#include "attend/parallel_mpi.h"
#include "attend/tensor.h"
#include "parallel/mpi_link.h"

namespace attend::parallel::detail {

struct Job {
  const Plan& plan;
  const Link& link;
  const RunOptions& options;
  const Policy& policy;
  Failure& failure;
  RunStats& stats;
};

// Seconds since `t0` added to `total`, for RunStats.
class Stopwatch {
 public:
  explicit Stopwatch(double& total) : total_(total), t0_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  Stopwatch(const Stopwatch&) = delete;
  Stopwatch& operator=(const Stopwatch&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point t0_;
};

struct LocalForward {
  Tensor out;  // (B, L, H, Dv): f32/f64 partial accumulator (ring) or effective_out_dtype (a2a)
  Tensor lse;  // (B, H, L)
};

struct LocalGrads {
  Tensor dq, dk, dv;  // this rank's rows; any floating dtype (converted when written out)
  Tensor dsinks;      // softmax_type = learnable: (H), the sinks' dtype, summed over every rank
};

// softmax_type = learnable: a zeroed (H) gradient of `sinks`' dtype.
Tensor zero_dsinks(const AttentionSpec& spec);
// Sums each rank's dsinks in place (every rank takes part, failed or not).
void sum_dsinks(const Job& job, const Tensor& dsinks);

LocalForward ring_forward(const Job& job, const Inputs& local);
LocalGrads ring_backward(const Job& job, const Inputs& local, const TensorView& out, const TensorView& lse,
                         const TensorView& dout);
LocalForward a2a_forward(const Job& job, const Inputs& local);
LocalGrads a2a_backward(const Job& job, const Inputs& local, const TensorView& out, const TensorView& lse,
                        const TensorView& dout);

// Runs fn(), recording an exception as this rank's failure; skipped once the
// rank has failed.
template <class Fn>
void guarded(Failure& failure, Fn&& fn) {
  if (failure.failed) return;
  try {
    fn();
  } catch (const std::exception& e) {
    failure.record(e);
  }
}

}  // namespace attend::parallel::detail
