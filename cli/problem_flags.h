// The problem flags shared by every subcommand, and their translation into an
// attend::AttentionSpec, a Mode and a Policy.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attend/select.h"
#include "attend/spec.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace attend_cli {

// Raw flag values, bound to CLI11 options by add_problem_flags. Every spec
// field the user sets directly is a flag made from spec_fields() (its text is
// parsed by attend::set_field); the members below are the convenience and
// compound flags, which set several fields or derive them.
struct ProblemFlags {
  ProblemFlags();

  // The text given for each row of attend::spec_fields(), in table order; empty:
  // not given (the spec keeps its default, or what a convenience flag set).
  std::vector<std::string> fields;
  const std::string& text(std::string_view field) const;
  void set_text(std::string_view field, std::string text);
  bool given(std::string_view field) const { return !text(field).empty(); }

  std::int64_t seqlen = 512, heads = 8, head_dim = 64;
  std::string window, bias = "none";
  bool no_lse = false;
  bool training = false, inference = false;
  std::vector<std::int64_t> varlen_q, varlen_kv;
  // KV cache: K/V in an attend::KVCache (paged), queries attend over it.
  bool kv_cache = false;
  std::int64_t page_size = 64;
  std::vector<std::int64_t> cache_seqlens, cache_leftpad;
  std::string backend, isa;
  std::string select, tune_cache;  // --select priority|autotune, --tune-cache path|off
  std::vector<std::string> disable;

  // Options whose presence (not only value) matters.
  CLI::Option* seqlen_opt = nullptr;
  CLI::Option* heads_opt = nullptr;
  CLI::Option* head_dim_opt = nullptr;
  CLI::Option* page_size_opt = nullptr;
};

// "--head-dim-qk" for head_dim_qk: the flag a spec field gets.
std::string flag_name(std::string_view field);
// Spec fields without a flag of their own because other flags derive them.
std::span<const std::string_view> derived_spec_fields();

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
