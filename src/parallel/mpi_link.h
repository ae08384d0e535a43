// The CP engines' use of MPI: non-blocking operations waited for with a
// deadline, and the agreement step that turns one rank's failure into the
// same attend::Error on every rank.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attend/error.h"

namespace attend::parallel::detail {

// What one rank tells the others at an agreement: whether it failed, why, and
// the fingerprint of the job it is running (spec, mode, cp config).
struct RankStatus {
  std::int32_t failed = 0;
  std::int32_t code = 0;  // ErrorCode of the failure
  std::uint64_t fingerprint = 0;
  char message[496] = {};
};

class Link {
 public:
  Link(MPI_Comm comm, double timeout_seconds);
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }

  // Non-blocking byte transfers with a peer (tags keep K/V and dK/dV apart).
  MPI_Request isend(const void* data, std::size_t bytes, int peer, int tag) const;
  MPI_Request irecv(void* data, std::size_t bytes, int peer, int tag) const;
  // MPI_Ialltoall of `bytes` per rank.
  MPI_Request ialltoall(const void* send, void* recv, std::size_t bytes) const;
  // In-place MPI_Iallreduce (sum) of `count` f32 or f64 values.
  MPI_Request iallreduce_sum(void* data, std::int64_t count, bool f64) const;
  // Progresses the requests without blocking (MPI moves large messages only
  // inside MPI calls, so the engines poke it between kernel calls).
  void poke(std::vector<MPI_Request>& requests) const;
  // Waits for every request until the deadline; throws attend::Error naming
  // `peer` (the rank that did not answer) and `what` on timeout.
  void wait(std::vector<MPI_Request>& requests, int peer, const char* what) const;

  // Every rank's status (an MPI_Iallgather with the same deadline). A rank
  // that failed earlier still takes part, so nobody waits on it in vain.
  std::vector<RankStatus> gather(const RankStatus& mine) const;
  // gather(), then throws on every rank the error of the first failed rank,
  // or one naming the first rank whose fingerprint differs from rank 0's.
  void agree(const RankStatus& mine) const;

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  double timeout_;
};

// A failure recorded for the next agreement: the rank keeps exchanging
// buffers (without computing) so its peers never wait for it in vain.
struct Failure {
  bool failed = false;
  ErrorCode code = ErrorCode::bad_state;
  std::string message;

  void record(const std::exception& e);
  RankStatus status(std::uint64_t fingerprint) const;
};

}  // namespace attend::parallel::detail
