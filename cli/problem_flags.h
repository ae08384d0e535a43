// The problem flags shared by every subcommand, and their translation into an
// attend::AttentionSpec, a Mode and a Policy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attend/select.h"
#include "attend/spec.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace attend_cli {

// Raw flag values, bound to CLI11 options by add_problem_flags. Sizes of 0 mean
// "not given" (the validators reject an explicit 0).
struct ProblemFlags {
  std::int64_t batch = 1, seqlen = 512, seqlen_q = 0, seqlen_kv = 0;
  std::int64_t heads = 8, heads_q = 0, heads_kv = 0;
  std::int64_t head_dim = 64, head_dim_qk = 0, head_dim_v = 0;
  std::string dtype = "f32", dq_dtype, layout, window, bias = "none";
  double scale = 0.0, softcap = 0.0, dropout = 0.0;
  std::uint64_t seed = 0;
  bool causal = false, alibi = false, bias_grad = false, deterministic = false, no_lse = false;
  bool training = false, inference = false;
  std::vector<std::int64_t> varlen_q, varlen_kv;
  // KV cache: K/V in an attend::KVCache (paged), queries attend over it.
  bool kv_cache = false;
  std::int64_t page_size = 64;
  std::vector<std::int64_t> cache_seqlens, cache_leftpad;
  std::string backend;
  std::vector<std::string> disable;

  // Options whose presence (not only value) matters.
  CLI::Option* batch_opt = nullptr;
  CLI::Option* seqlen_opt = nullptr;
  CLI::Option* scale_opt = nullptr;
  CLI::Option* heads_opt = nullptr;
  CLI::Option* head_dim_opt = nullptr;
  CLI::Option* page_size_opt = nullptr;
};

void add_problem_flags(CLI::App& app, ProblemFlags& flags);

// A fully-resolved problem.
struct Problem {
  attend::AttentionSpec spec;
  attend::Mode mode = attend::Mode::training;
  attend::Policy policy;
  std::vector<std::int64_t> lens_q, lens_kv;  // varlen: per-sequence lengths
  std::int64_t bias_batch = 0, bias_heads = 0;  // has_bias: leading dims of bias (1|B, 1|H)
  // spec.paged(): stored tokens and left padding per sequence, as given; empty:
  // every sequence stores spec.seqlen_kv tokens, unpadded (not materialised here,
  // so a huge --batch costs nothing before the problem's sizes are checked).
  std::vector<std::int64_t> cache_lens, cache_pads;
  std::int64_t cache_len(std::int64_t b) const {
    return cache_lens.empty() ? spec.seqlen_kv : cache_lens[static_cast<std::size_t>(b)];
  }
  std::int64_t cache_pad(std::int64_t b) const { return cache_pads.empty() ? 0 : cache_pads[static_cast<std::size_t>(b)]; }
};

// Builds and validates the problem; throws attend::Error (bad values, unknown
// --backend) or CLI::ValidationError (malformed flag text).
Problem make_problem(const ProblemFlags& flags);

// Parses argument lists (problem flags only: no program or subcommand name) as
// every subcommand does, then make_problem. Throws CLI::ParseError for malformed
// flags, attend::Error for invalid problems. For tests and the fuzz target: one
// parser serves many lists, each parsed from the defaults as a fresh tool would.
class ProblemParser {
 public:
  ProblemParser();
  ~ProblemParser();
  Problem parse(std::vector<std::string> args);

 private:
  std::unique_ptr<CLI::App> app_;
  ProblemFlags flags_, defaults_;
};
Problem parse_problem_args(std::vector<std::string> args);

// "training" or "inference", with what the mode requires.
std::string describe_mode(attend::Mode mode);

}  // namespace attend_cli
