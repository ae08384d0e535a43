// The CLI's problem flags: argv text -> ProblemFlags -> AttentionSpec -> selection.
#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attend/attend.h"
#include "commands.h"
#include "problem_data.h"
#include "problem_flags.h"
#include "targets.h"

namespace attend_fuzz {
namespace {

constexpr std::size_t kMaxArgs = 64;
constexpr std::int64_t kMaxDataElements = 1 << 14;

// True when no tensor `attend run` would allocate has more than
// kMaxDataElements elements (an overflowing size counts as too many).
bool small_data(const attend_cli::Problem& p) {
  const attend::AttentionSpec& s = p.spec;
  const auto numel = [](std::initializer_list<std::int64_t> dims) {
    std::int64_t n = 1;
    for (std::int64_t d : dims) {
      if (d < 0 || __builtin_mul_overflow(n, d, &n)) return kMaxDataElements + 1;
    }
    return n;
  };
  const std::int64_t rows_q = s.varlen() ? s.total_q : numel({s.batch, s.seqlen_q});
  // A KV cache stores up to max(cache_lens) tokens per sequence, left padding included.
  const std::int64_t stored =
      p.cache_lens.empty() ? s.seqlen_kv : *std::max_element(p.cache_lens.begin(), p.cache_lens.end());
  const std::int64_t rows_kv = s.varlen() ? s.total_kv : numel({s.batch, std::max(s.seqlen_kv, stored)});
  const std::int64_t dmax = std::max(s.head_dim_qk, s.head_dim_v);
  return numel({rows_q, s.heads_q, dmax}) <= kMaxDataElements && numel({rows_kv, s.heads_kv, dmax}) <= kMaxDataElements &&
         (!s.has_bias || numel({p.bias_batch, p.bias_heads, s.seqlen_q, s.seqlen_kv}) <= kMaxDataElements) &&
         static_cast<std::int64_t>(p.lens_q.size()) <= kMaxDataElements;
}

#ifdef ATTEND_FUZZ_BENCH
constexpr std::int64_t kMaxBenchScores = 1 << 18;

// True when the score matrices a bench run computes (every head, every
// sequence) hold at most kMaxBenchScores elements: the data can be tiny while
// S^2 is not (H=2 D=1 S=4096 is 16k elements of data and 33M scores, some 80 s
// of forward and backward under the sanitizers), and libFuzzer's per-input
// timeout counts the kernels' time.
bool small_scores(const attend::AttentionSpec& s) {
  std::int64_t n = 0;
  const std::int64_t rows = s.varlen() ? s.total_q : s.seqlen_q;
  const std::int64_t cols = s.varlen() ? s.total_kv : s.seqlen_kv;
  const std::int64_t batch = s.varlen() ? 1 : s.batch;
  if (rows < 0 || cols < 0 || batch < 0 || __builtin_mul_overflow(rows, cols, &n) ||
      __builtin_mul_overflow(n, batch, &n) || __builtin_mul_overflow(n, s.heads_q, &n)) {
    return false;
  }
  return n <= kMaxBenchScores;
}

// `attend bench ARGS` as the tool runs it, on tiny problems only, with the
// shortest timing, a tiny sgemm, no files and the output discarded: the
// harness, the data it builds and the FLOP count are what is exercised.
void bench(std::vector<std::string> args) {
  static CLI::App app("attend", "attend");
  static attend_cli::BenchCommand cmd;
  static CLI::App* const sub = attend_cli::add_bench_command(app, cmd);
  static const attend_cli::BenchCommand defaults = cmd;
  static std::ostream discard(nullptr);
  cmd = defaults;
  app.clear();
  std::reverse(args.begin(), args.end());  // CLI11 consumes the vector from the back
  try {
    app.parse(args);
    if (!sub->parsed() || cmd.seqlens.size() > 2 || cmd.dtypes.size() > 2) return;
    attend_cli::Problem p = attend_cli::make_problem(cmd.problem);
    if (!small_data(p) || !small_scores(p.spec)) return;
    for (const std::int64_t len : cmd.seqlens) {
      p.spec.seqlen_q = p.spec.seqlen_kv = len;
      if (cmd.tokens > 0 && len > 0) p.spec.batch = cmd.tokens / len;  // as the bench sweeps it
      if (!small_data(p) || !small_scores(p.spec)) return;
    }
    // With no problem flag the bench runs its S=4096 target problem.
    if (cmd.seqlens.empty() && !cmd.causal_sweep) {
      bool any = false;
      for (const CLI::Option* opt : sub->get_options())
        any = any || (opt->count() > 0 && opt->get_group() == "Problem");
      if (!any) return;
    }
    cmd.min_time = 1e-6;
    cmd.sgemm_n = std::min<std::int64_t>(cmd.sgemm_n, 8);
    cmd.csv_path.clear();
    cmd.json_path.clear();
    cmd.out = cmd.progress = &discard;
    (void)attend_cli::run_bench(cmd, *sub);
  } catch (const CLI::ParseError&) {
  } catch (const attend::Error&) {
  }
}
#endif

}  // namespace

void cli_flags(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args(1);
  for (std::size_t i = 0; i < size; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == '\n') {
      if (args.size() == kMaxArgs) break;
      args.emplace_back();
    } else {
      args.back() += c;
    }
  }
#ifdef ATTEND_FUZZ_BENCH
  if (args.front() == "bench") return bench(std::move(args));
#endif
  attend_cli::Problem p;
  try {
    static attend_cli::ProblemParser parser;  // built once: CLI11 setup dominates a run
    p = parser.parse(args);
  } catch (const CLI::ParseError&) {
    return;
  } catch (const attend::Error&) {
    return;
  }
  // A problem the flags accepted is a valid spec: selection either picks a
  // backend or explains why none fits, and tiny problems get their data.
  attend::validate(p.spec);
  try {
    (void)attend::select(p.spec, p.mode, p.policy);
  } catch (const attend::Error& e) {
    if (e.code() != attend::ErrorCode::unsupported) throw;
  }
  if (small_data(p)) {
    try {
      const attend_cli::ProblemData d =
          attend_cli::make_data(p, attend_cli::DataSources{{}, {}, {}, {}, 1, p.mode == attend::Mode::training, {}});
      attend::validate_inputs(p.spec, d.inputs());
    } catch (const attend::Error& e) {
      // Only the documented refusal: more packed tokens than cu_seqlens' int32 can index.
      if (e.code() != attend::ErrorCode::overflow) throw;
    }
  }
}

}  // namespace attend_fuzz
