// The subcommands of the attend tool. Each add_* registers its options on a new
// subcommand of `app`; the matching run_* executes it after parsing and returns
// the process exit code.
#pragma once

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "cp_flags.h"
#include "problem_flags.h"

namespace CLI {
class App;
}

namespace attend_cli {

// Exit codes beyond 0: 1 usage error, 2 attend::Error, 3 --check out of tolerance.
inline constexpr int kExitUsage = 1;
inline constexpr int kExitError = 2;
inline constexpr int kExitCheckFailed = 3;

struct SelectCommand {
  ProblemFlags problem;
  CpFlags cp;
  bool json = false, autotune = false;
  std::string device = "cpu";  // where the tensors would live: cpu, cuda, cuda:N
  std::string target;          // the GPU the cudnn backend assumes without one (ATTEND_CUDNN_TARGET)
};
CLI::App* add_select_command(CLI::App& app, SelectCommand& cmd);
int run_select(const SelectCommand& cmd);

struct RunCommand {
  ProblemFlags problem;
  bool check = false, json = false;
  double tolerance = 0.0;  // 0: a default from the dtype
  std::string q_path, k_path, v_path, dout_path, alibi_slopes_path, sinks_path, save_dir;
  std::uint64_t data_seed = 1;
  std::int64_t repeat = 1;
  CpFlags cp;
};
CLI::App* add_run_command(CLI::App& app, RunCommand& cmd);
// `sub` is the parsed subcommand (to tell "no flags at all" from defaults).
int run_run(RunCommand& cmd, const CLI::App& sub);
// `run --cp N` under mpirun: the job split across the ranks, checked on rank 0.
// Built with the MPI engine only (ATTEND_CLI_MPI).
int run_cp(RunCommand& cmd);

// attend tune: time the viable plans of a problem (or of a grid of shapes,
// --sweep) now, record the winners in the autotune cache, print the table.
struct TuneCommand {
  ProblemFlags problem;
  bool sweep = false;
  std::ostream* out = &std::cout;       // the table
  std::ostream* progress = &std::cerr;  // "[i/n] shape" while tuning
};
CLI::App* add_tune_command(CLI::App& app, TuneCommand& cmd);
int run_tune(TuneCommand& cmd, const CLI::App& sub);

// attend bench: flash vs the unfused OpenBLAS baseline (and the reference) next
// to a measured sgemm peak. Built only with ATTEND_BUILD_BENCH (ATTEND_CLI_BENCH).
struct BenchCommand {
  ProblemFlags problem;  // add_bench_command sets the target shape as the defaults
  std::vector<std::int64_t> seqlens;  // each sets seqlen_q = seqlen_kv
  std::int64_t tokens = 0;            // > 0: batch = tokens / seqlen at every sweep point
  bool causal_sweep = false, summary = false, force_reference = false;
  std::vector<std::string> dtypes;  // each problem once per dtype (f32, bf16, f16); empty: --dtype
  std::vector<std::string> impls{"flash", "unfused"};
  std::vector<std::string> passes{"forward", "backward"};
  double min_time = 0.5;
  std::int64_t sgemm_n = 2048;
  std::uint64_t data_seed = 1;
  std::string csv_path, json_path;
  std::ostream* out = &std::cout;       // the header, table and notes
  std::ostream* progress = &std::cerr;  // one line per measurement
};
CLI::App* add_bench_command(CLI::App& app, BenchCommand& cmd);
int run_bench(BenchCommand& cmd, const CLI::App& sub);

}  // namespace attend_cli
