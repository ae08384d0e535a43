// The context-parallel flags of `attend select` and `attend run`. Not spec
// fields: they say how a problem is split across processes, not what it is.
#pragma once

#include <string>

#include "attend/parallel.h"

namespace CLI {
class App;
}

namespace attend_cli {

struct CpFlags {
  int size = 0;  // --cp: ranks sharing the sequence; 0: no context parallelism
  int rank = 0;  // --cp-rank (select only: run takes its MPI rank)
  std::string strategy = "auto";
  double timeout = 60.0;  // --cp-timeout, seconds (run)
  bool enabled() const { return size > 0; }
  attend::parallel::Config config(int rank_in_job) const {
    return {size, rank_in_job, attend::parallel::parse_strategy(strategy, "--cp-strategy")};
  }
};

// `run`: also --cp-timeout; `select`: also --cp-rank.
void add_cp_flags(CLI::App& sub, CpFlags& flags, bool run);

}  // namespace attend_cli
