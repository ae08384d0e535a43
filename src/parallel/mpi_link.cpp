// Bounded waits and error agreement over MPI.
#include "parallel/mpi_link.h"

#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

namespace attend::parallel::detail {

namespace {

int count_of(std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(INT_MAX)) {
    throw Error(ErrorCode::overflow, "cp message bytes", std::to_string(bytes),
                "one CP message exceeds MPI's int count", std::to_string(INT_MAX));
  }
  return static_cast<int>(bytes);
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(ErrorCode::bad_state, what, std::to_string(rc), std::string(text, static_cast<std::size_t>(len)));
}

}  // namespace

Link::Link(MPI_Comm comm, double timeout_seconds) : comm_(comm), timeout_(timeout_seconds) {
  if (!(timeout_seconds > 0.0)) {
    throw Error(ErrorCode::invalid_argument, "timeout_seconds", std::to_string(timeout_seconds), "must be > 0");
  }
  check(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm, &size_), "MPI_Comm_size");
}

MPI_Request Link::isend(const void* data, std::size_t bytes, int peer, int tag) const {
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Isend(data, count_of(bytes), MPI_BYTE, peer, tag, comm_, &r), "MPI_Isend");
  return r;
}

MPI_Request Link::irecv(void* data, std::size_t bytes, int peer, int tag) const {
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Irecv(data, count_of(bytes), MPI_BYTE, peer, tag, comm_, &r), "MPI_Irecv");
  return r;
}

MPI_Request Link::ialltoall(const void* send, void* recv, std::size_t bytes) const {
  MPI_Request r = MPI_REQUEST_NULL;
  const int n = count_of(bytes);
  check(MPI_Ialltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &r), "MPI_Ialltoall");
  return r;
}

MPI_Request Link::iallreduce_sum(void* data, std::int64_t count, bool f64) const {
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, comm_, &r),
        "MPI_Iallreduce");
  return r;
}

void Link::poke(std::vector<MPI_Request>& requests) const {
  if (requests.empty()) return;
  int done = 0;
  MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
}

void Link::wait(std::vector<MPI_Request>& requests, int peer, const char* what) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
  for (;;) {
    int done = 0;
    check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) {
      requests.clear();
      return;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      // The requests stay pending: the communicator is unusable after a
      // timeout (the peer is gone or stuck), which the error says.
      requests.clear();
      const std::string who = peer >= 0 ? "rank " + std::to_string(peer) : std::string("a rank");
      throw Error(ErrorCode::bad_state, "cp_rank", peer >= 0 ? std::to_string(peer) : "unknown",
                  who + " did not answer within " + std::to_string(timeout_) + " s (" + what + " on rank " +
                      std::to_string(rank_) + "); the communicator should be aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::vector<RankStatus> Link::gather(const RankStatus& mine) const {
  std::vector<RankStatus> all(static_cast<std::size_t>(size_));
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Iallgather(&mine, sizeof(RankStatus), MPI_BYTE, all.data(), sizeof(RankStatus), MPI_BYTE, comm_, &r),
        "MPI_Iallgather");
  std::vector<MPI_Request> reqs{r};
  // A collective: no single peer to blame.
  wait(reqs, -1, "agreement on the CP job's status");
  return all;
}

void Link::agree(const RankStatus& mine) const {
  const std::vector<RankStatus> all = gather(mine);
  for (int r = 0; r < size_; ++r) {
    const RankStatus& s = all[static_cast<std::size_t>(r)];
    if (!s.failed) continue;
    std::string msg(s.message, strnlen(s.message, sizeof s.message));
    throw Error(static_cast<ErrorCode>(s.code), "cp_rank", std::to_string(r),
                "rank " + std::to_string(r) + " of " + std::to_string(size_) + " failed: " + msg);
  }
  for (int r = 1; r < size_; ++r) {
    if (all[static_cast<std::size_t>(r)].fingerprint == all[0].fingerprint) continue;
    throw Error(ErrorCode::invalid_argument, "cp_rank", std::to_string(r),
                "rank " + std::to_string(r) +
                    " runs a different problem than rank 0 (spec, mode or CP config differ; every rank must pass "
                    "the same)");
  }
}

void Failure::record(const std::exception& e) {
  if (failed) return;  // the first failure is the cause
  failed = true;
  const auto* err = dynamic_cast<const Error*>(&e);
  code = err != nullptr ? err->code() : ErrorCode::bad_state;
  message = e.what();
}

RankStatus Failure::status(std::uint64_t fingerprint) const {
  RankStatus s;
  s.failed = failed ? 1 : 0;
  s.code = static_cast<std::int32_t>(code);
  s.fingerprint = fingerprint;
  std::strncpy(s.message, message.c_str(), sizeof s.message - 1);
  return s;
}

}  // namespace attend::parallel::detail
