// attend bench: flash against the unfused OpenBLAS baseline (and optionally the
// reference) on a sweep of problems, next to a measured sgemm peak, all in one
// process. The harness, the baseline and the output format live in bench/.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attend/error.h"
#include "bench/amx_peak.h"
#include "bench/bf16_gemm_peak.h"
#include "bench/harness.h"
#include "bench/report.h"
#include "bench/sgemm_peak.h"
#include "bench/summary.h"
#include "commands.h"
#include "flag_checks.h"
#include "problem_data.h"

namespace attend_cli {

namespace {

namespace ab = attend::bench;

// The target problem: the shape the performance targets are stated for.
constexpr std::int64_t kTargetHeads = 16, kTargetHeadDim = 128, kTargetSeqlen = 4096;

// True when a flag that defines the problem was given; without one the run is
// the target problem, swept over both masks, with the target summary.
bool any_problem_flag(const CLI::App& sub, const BenchCommand& cmd) {
  for (const CLI::Option* opt : sub.get_options()) {
    if (opt->count() > 0 && opt->get_group() == "Problem") return true;
  }
  return !cmd.seqlens.empty() || cmd.causal_sweep || cmd.tokens > 0;
}

void reject_policy_flags(const ProblemFlags& f) {
  const char* flag = !f.backend.empty()   ? "--backend"
                     : !f.disable.empty() ? "--disable"
                     : !f.isa.empty()     ? "--isa"
                                          : nullptr;
  if (flag != nullptr) {
    throw attend::Error(attend::ErrorCode::invalid_argument, flag, "given",
                        "attend bench runs each implementation directly; choose them with --impls");
  }
}

// The baselines and the harness's buffers know whole problems only: a partial
// problem's offsets or f32 output would be measured against something else.
void reject_partial_fields(const attend::AttentionSpec& s) {
  const char* flag = s.q_offset != 0                      ? "--q-offset"
                     : s.kv_offset != 0                   ? "--kv-offset"
                     : s.effective_out_dtype() != s.dtype ? "--out-dtype"
                                                          : nullptr;
  if (flag != nullptr) {
    throw attend::Error(attend::ErrorCode::invalid_argument, flag, "given",
                        "attend bench measures whole problems (use attend run for partial ones)");
  }
}

std::vector<attend::AttentionSpec> problems_of(const BenchCommand& cmd, const Problem& base) {
  if (!cmd.seqlens.empty() && (base.spec.varlen() || base.spec.paged())) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--seqlens", "given",
                        "cannot sweep sequence lengths of a varlen or KV-cache problem (their lengths come from "
                        "--varlen-q/--varlen-kv or --seqlen-kv/--cache-seqlens)");
  }
  std::vector<attend::AttentionSpec> out;
  std::vector<std::int64_t> seqlens = cmd.seqlens;
  if (seqlens.empty()) seqlens.push_back(0);  // 0: keep the problem's own lengths
  std::vector<attend::DType> dtypes;
  for (const std::string& d : cmd.dtypes) dtypes.push_back(attend::parse_dtype(d, "--dtypes"));
  if (dtypes.empty()) dtypes.push_back(base.spec.dtype);
  if (cmd.tokens > 0 && (base.spec.varlen() || base.spec.paged())) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--tokens", std::to_string(cmd.tokens),
                        "sets the batch of dense problems only");
  }
  for (const std::int64_t s : seqlens) {
    // --tokens keeps B*S (the work per row of attention) fixed across the sweep,
    // so short sequences are measured on as many rows as long ones.
    const std::int64_t seqlen = s > 0 ? s : base.spec.seqlen_q;
    if (cmd.tokens > 0 && (cmd.tokens % seqlen != 0 || base.spec.seqlen_q != base.spec.seqlen_kv)) {
      throw attend::Error(attend::ErrorCode::invalid_argument, "--tokens", std::to_string(cmd.tokens),
                          "must be a multiple of every swept sequence length (seqlen " + std::to_string(seqlen) +
                              ", seqlen_q = seqlen_kv)");
    }
    for (const bool causal : cmd.causal_sweep ? std::vector<bool>{false, true} : std::vector<bool>{base.spec.causal}) {
      for (const attend::DType dt : dtypes) {  // dtypes innermost: compared rows sit side by side
        attend::AttentionSpec spec = base.spec;
        if (s > 0) spec.seqlen_q = spec.seqlen_kv = s;
        if (cmd.tokens > 0) spec.batch = cmd.tokens / seqlen;
        spec.causal = causal;
        spec.dtype = dt;
        out.push_back(spec);
      }
    }
  }
  return out;
}

// "bf16 vs f32": for every row of a non-f32 dtype, the f32 row of the same
// problem, implementation and pass measured in this run, as a speed-up.
void print_dtype_ratios(std::ostream& os, const ab::Report& report) {
  bool any = false;
  for (const ab::Row& r : report.rows) {
    if (r.spec.dtype == attend::DType::f32) continue;
    attend::AttentionSpec as_f32 = r.spec;
    as_f32.dtype = attend::DType::f32;
    for (const ab::Row& base : report.rows) {
      if (base.impl != r.impl || base.pass != r.pass || attend::signature(base.spec) != attend::signature(as_f32)) continue;
      if (!any) os << "\ndtype speed-ups (same problem, same run; f32 time / this dtype's time):\n";
      any = true;
      char buf[200];
      std::snprintf(buf, sizeof buf, "  %-40s %-8s %-9s %s vs f32: %.2fx\n", r.problem.c_str(),
                    std::string(ab::to_string(r.impl)).c_str(), std::string(attend::to_string(r.pass)).c_str(),
                    std::string(attend::to_string(r.spec.dtype)).c_str(), base.timing.best_s / r.timing.best_s);
      os << buf;
    }
  }
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app, BenchCommand& cmd) {
  auto* sub = app.add_subcommand(
      "bench",
      "Benchmark flash against an unfused OpenBLAS baseline (and the reference) next to a measured sgemm peak.\n"
      "Prints GFLOP/s and ratios (format: bench/README.md); progress goes to stderr.\n"
      "With no problem flags: the target problem (B=1 H=16 D=128 S=4096 f32), non-causal and causal, "
      "and a summary of the target ratios.");
  cmd.problem.heads = kTargetHeads;
  cmd.problem.head_dim = kTargetHeadDim;
  cmd.problem.seqlen = kTargetSeqlen;
  add_problem_flags(*sub, cmd.problem);
  const char* g = "Bench";
  sub->add_option("--seqlens", cmd.seqlens, "sweep: each value sets seqlen_q = seqlen_kv, e.g. 1024,4096")
      ->delimiter(',')->check(positive_int())->group(g);
  sub->add_option("--tokens", cmd.tokens,
                  "with --seqlens: batch = TOKENS / seqlen at each length (B*S fixed), e.g. 4096")
      ->check(positive_int())
      ->group(g);
  sub->add_flag("--causal-sweep", cmd.causal_sweep, "run every problem both non-causal and causal")->group(g);
  sub->add_option("--dtypes", cmd.dtypes,
                  "run every problem in each dtype, e.g. f32,bf16 (prints each dtype's speed-up over f32)")
      ->delimiter(',')->check(CLI::IsMember({"f32", "bf16", "f16"}))->group(g);
  // Any registered backend (name or name:variant) or unfused; parse_impl checks
  // the names against the registry, so a new backend needs no edit here.
  sub->add_option("--impls", cmd.impls,
                  "implementations: unfused, api (the public attend::forward/backward), api:given (outputs given), or "
                  "registered backends as name or name:variant (e.g. flash:avx2)")
      ->delimiter(',')
      ->group(g)
      ->capture_default_str();
  sub->add_option("--passes", cmd.passes, "passes: forward,backward [forward only with --inference]")
      ->delimiter(',')->check(CLI::IsMember({"forward", "backward"}))->group(g)->capture_default_str();
  sub->add_flag("--force-reference", cmd.force_reference,
                "run the reference even where B*H*Sq*Sk > 2^26 (it is slow)")->group(g);
  sub->add_option("--min-time", cmd.min_time, "seconds each measurement runs for, at least (and >= 3 runs)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(text.c_str(), &end);
            return (end != text.c_str() && *end == '\0' && v > 0.0 && v <= 3600.0) ? "" : "must be in (0, 3600]";
          },
          "SECONDS"))
      ->group(g)->capture_default_str();
  sub->add_option("--sgemm-n", cmd.sgemm_n, "size of the n x n x n sgemm (and bf16 GEMM) that measure the peaks")
      ->check(int_in_range(1, 16384))
      ->group(g)
      ->capture_default_str();
  sub->add_option("--data-seed", cmd.data_seed, "seed of the random inputs")
      ->check(any_uint64())
      ->group(g)
      ->capture_default_str();
  sub->add_flag("--summary", cmd.summary, "print the target ratios after the table (implied with no problem flags)")
      ->group(g);
  sub->add_option("--csv", cmd.csv_path, "also write the rows as CSV to FILE")->group(g);
  sub->add_option("--json", cmd.json_path, "also write the header and rows as JSON to FILE")->group(g);
  return sub;
}

int run_bench(BenchCommand& cmd, const CLI::App& sub) {
  if (!any_problem_flag(sub, cmd)) {
    cmd.causal_sweep = true;
    cmd.summary = true;
    *cmd.out << "no problem flags: the target problem (B=1 H=16 D=128 S=4096 f32), non-causal and causal\n";
  }
  reject_policy_flags(cmd.problem);
  const Problem base = make_problem(cmd.problem);
  reject_partial_fields(base.spec);
  const auto measurable = [](attend::DType d) {
    return d == attend::DType::f32 || d == attend::DType::bf16 || d == attend::DType::f16;
  };
  if (!measurable(base.spec.dtype)) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--dtype", std::string(attend::to_string(base.spec.dtype)),
                        "attend bench measures f32, bf16 and f16 (what flash computes; unfused is f32 only)");
  }
  for (const std::string& d : cmd.dtypes) {
    if (!measurable(attend::parse_dtype(d, "--dtypes"))) {
      throw attend::Error(attend::ErrorCode::invalid_argument, "--dtypes", d, "expected f32, bf16 or f16");
    }
  }

  ab::HarnessOptions opt;
  opt.impls.clear();
  for (const std::string& name : cmd.impls) {
    try {
      opt.impls.push_back(ab::parse_impl(name));
    } catch (const attend::Error& e) {  // a misspelt flag value: a usage error, like every other flag
      throw CLI::ValidationError("--impls", name + ": " + e.detail());
    }
  }
  opt.passes.clear();
  const bool passes_given = sub.get_option("--passes")->count() > 0;
  for (const std::string& name : cmd.passes) {
    const attend::Pass pass = name == "forward" ? attend::Pass::forward : attend::Pass::backward;
    if (pass == attend::Pass::backward && base.mode == attend::Mode::inference) {
      if (passes_given) {
        throw CLI::ValidationError("--passes",
                                   "backward is a training pass: it cannot run with --inference (or "
                                   "--kv-cache); drop it or use --training");
      }
      continue;
    }
    opt.passes.push_back(pass);
  }
  opt.timing.min_time = cmd.min_time;
  opt.force_reference = cmd.force_reference;
  opt.progress = cmd.progress;
  opt.make_tensors = [&base, seed = cmd.data_seed](const attend::AttentionSpec& spec) {
    Problem p = base;
    p.spec = spec;
    const ProblemData d = make_data(p, DataSources{{}, {}, {}, {}, seed, true, {}});
    return ab::ProblemTensors{d.q,     d.k,       d.v,      d.dout, d.bias, d.slopes, d.cu_seqlens_q, d.cu_seqlens_kv,
                              d.cache, d.k_scale, d.v_scale};
  };
  const std::vector<attend::AttentionSpec> problems = problems_of(cmd, base);

  *cmd.progress << "measuring the sgemm peak (n=" << cmd.sgemm_n << ") ..." << std::flush;
  ab::TimingOptions sgemm_timing;
  sgemm_timing.min_time = cmd.min_time;
  const ab::SgemmPeak peak = ab::measure_sgemm_peak(cmd.sgemm_n, sgemm_timing);
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.1f GFLOP/s\n", peak.gflops);
  *cmd.progress << buf << std::flush;
  // The bf16 rows' ceilings, measured only when there are bf16 rows.
  ab::Bf16GemmPeak bf16_peak;
  ab::AmxPeak amx_peak;
  const bool any_bf16 = std::any_of(problems.begin(), problems.end(),
                                    [](const attend::AttentionSpec& s) { return s.dtype == attend::DType::bf16; });
  if (any_bf16) {
    *cmd.progress << "measuring the bf16 GEMM peak (n=" << cmd.sgemm_n << ") ..." << std::flush;
    bf16_peak = ab::measure_bf16_gemm_peak(cmd.sgemm_n, sgemm_timing);
    std::snprintf(buf, sizeof buf, " %.1f GFLOP/s\n", bf16_peak.gflops);
    *cmd.progress << buf << std::flush;
    *cmd.progress << "measuring the AMX peak (TDPBF16PS on tiles in registers) ..." << std::flush;
    amx_peak = ab::measure_amx_peak(ab::kAmxMaxTrips, sgemm_timing);
    if (amx_peak.measured()) {
      std::snprintf(buf, sizeof buf, " %.1f GFLOP/s\n", amx_peak.gflops);
      *cmd.progress << buf << std::flush;
    } else {
      *cmd.progress << " - (" << amx_peak.missing << ")\n" << std::flush;
    }
  }

  const ab::Report report = ab::run_benchmarks(problems, opt, ab::make_header(peak, bf16_peak, amx_peak));
  std::ostream& out = *cmd.out;
  ab::print_report(out, report);
  print_dtype_ratios(out, report);
  if (cmd.summary) ab::print_target_summary(out, report);
  if (!cmd.csv_path.empty()) {
    ab::write_csv(cmd.csv_path, report);
    out << "csv: " << cmd.csv_path << "\n";
  }
  if (!cmd.json_path.empty()) {
    ab::write_json(cmd.json_path, report);
    out << "json: " << cmd.json_path << "\n";
  }
  return 0;
}

}  // namespace attend_cli
