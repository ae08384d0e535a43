// The CLI's problem flags: argv text -> ProblemFlags -> AttentionSpec -> selection.
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attend/attend.h"
#include "problem_data.h"
#include "problem_flags.h"
#include "targets.h"

namespace attend_fuzz {
namespace {

constexpr std::size_t kMaxArgs = 64;
constexpr std::int64_t kMaxDataElements = 1 << 14;

// Elements of the largest tensor `attend run` would allocate, or -1 when that
// is more than kMaxDataElements (or overflows).
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
  const std::int64_t rows_kv = s.varlen() ? s.total_kv : numel({s.batch, s.seqlen_kv});
  const std::int64_t dmax = std::max(s.head_dim_qk, s.head_dim_v);
  return numel({rows_q, s.heads_q, dmax}) <= kMaxDataElements && numel({rows_kv, s.heads_kv, dmax}) <= kMaxDataElements &&
         (!s.has_bias || numel({p.bias_batch, p.bias_heads, s.seqlen_q, s.seqlen_kv}) <= kMaxDataElements) &&
         static_cast<std::int64_t>(p.lens_q.size()) <= kMaxDataElements;
}

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
      const attend_cli::ProblemData d = attend_cli::make_data(p, attend_cli::DataSources{{}, {}, {}, {}, 1, p.mode == attend::Mode::training});
      attend::validate_inputs(p.spec, d.inputs());
    } catch (const attend::Error& e) {
      // Only the documented refusal: more packed tokens than cu_seqlens' int32 can index.
      if (e.code() != attend::ErrorCode::overflow) throw;
    }
  }
}

}  // namespace attend_fuzz
