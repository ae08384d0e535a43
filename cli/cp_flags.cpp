// The --cp flags.
#include "cp_flags.h"

#include <CLI/CLI.hpp>

#include "flag_checks.h"

namespace attend_cli {

void add_cp_flags(CLI::App& sub, CpFlags& flags, bool run) {
  const char* g = "Context parallelism";
  sub.add_option("--cp", flags.size,
                 run ? "split the sequence across this many MPI ranks (start with mpirun -np N; needs the MPI build)"
                     : "explain the context-parallel strategies for this many ranks (no MPI needed)")
      ->check(positive_int())
      ->group(g);
  sub.add_option("--cp-strategy", flags.strategy,
                 "auto (first of ring, a2a that fits), ring or a2a (forced: no fallback)")
      ->check(CLI::IsMember({"auto", "ring", "a2a"}))
      ->group(g)
      ->capture_default_str();
  if (run) {
    sub.add_option("--cp-timeout", flags.timeout, "seconds any rank waits for a peer before failing the job")
        ->check(CLI::PositiveNumber)
        ->group(g)
        ->capture_default_str();
  } else {
    sub.add_option("--cp-rank", flags.rank, "the rank whose ring schedule to show")
        ->check(non_negative_int())
        ->group(g)
        ->capture_default_str();
  }
}

}  // namespace attend_cli
