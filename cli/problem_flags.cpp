#include "problem_flags.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <iterator>
#include <numeric>
#include <stdexcept>
#include <string_view>

#include <CLI/CLI.hpp>

#include "attend/error.h"
#include "attend/registry.h"
#include "attend/spec_fields.h"
#include "flag_checks.h"
#include "problem_data.h"
#include "runtime/checked.h"

namespace attend_cli {

namespace {

// Spec fields the CLI derives, so a flag of their own could only contradict
// the flags they come from.
constexpr std::string_view kDerived[] = {
    "total_q",       // the sum of --varlen-q
    "total_kv",      // the sum of --varlen-kv
    "has_bias",      // --bias, which also fixes the bias's broadcast shape
    "kv_page_size",  // --kv-cache with --page-size, which build the cache
    "kv_leftpad",    // --cache-leftpad, whose values the cache needs
};

// The spellings the CLI had before its field flags came from the table; kept
// so that existing command lines keep working.
struct Alias {
  std::string_view field, flag;
};
constexpr Alias kAliases[] = {
    {"dropout_p", "--dropout"}, {"dropout_seed", "--seed"}, {"bias_requires_grad", "--bias-grad"}};

std::size_t field_index(std::string_view name) {
  const attend::SpecField* f = attend::find_spec_field(name);
  if (f == nullptr) throw std::logic_error("no spec field named " + std::string(name));
  return static_cast<std::size_t>(f - attend::spec_fields().data());
}

// Malformed text is a usage error that names the flag and the field.
CLI::Validator parses_as(const attend::SpecField& field) {
  return CLI::Validator(
      [&field](std::string& text) -> std::string {
        attend::AttentionSpec scratch;
        try {
          attend::set_field(scratch, field, text);
        } catch (const attend::Error& e) {
          return e.what();
        }
        return {};
      },
      "");
}

}  // namespace

ProblemFlags::ProblemFlags() : fields(attend::spec_fields().size()) {}

const std::string& ProblemFlags::text(std::string_view field) const { return fields[field_index(field)]; }

void ProblemFlags::set_text(std::string_view field, std::string value) {
  fields[field_index(field)] = std::move(value);
}

std::string flag_name(std::string_view field) {
  std::string flag = "--" + std::string(field);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

std::span<const std::string_view> derived_spec_fields() { return kDerived; }

void add_problem_flags(CLI::App& app, ProblemFlags& f) {
  const auto pos = positive_int();
  const char* g = "Problem";
  f.seqlen_opt = app.add_option("--seqlen", f.seqlen, "sets --seqlen-q and --seqlen-kv")
                     ->check(pos)
                     ->group(g)
                     ->capture_default_str();
  f.heads_opt =
      app.add_option("--heads", f.heads, "sets --heads-q and --heads-kv")->check(pos)->group(g)->capture_default_str();
  f.head_dim_opt = app.add_option("--head-dim", f.head_dim, "sets --head-dim-qk and --head-dim-v")
                       ->check(pos)
                       ->group(g)
                       ->capture_default_str();
  std::vector<CLI::Option*> field_opts(f.fields.size(), nullptr);
  for (const attend::SpecField& field : attend::spec_fields()) {
    if (std::find(std::begin(kDerived), std::end(kDerived), field.name) != std::end(kDerived)) continue;
    std::string names = flag_name(field.name);
    for (const Alias& a : kAliases) {
      if (a.field == field.name) names += "," + std::string(a.flag);
    }
    const std::size_t i = field_index(field.name);
    const std::string help(field.help);
    CLI::Option* opt = attend::field_kind(field) == attend::FieldKind::boolean
                           ? app.add_flag(names, f.fields[i], help)
                           : app.add_option(names, f.fields[i], help);
    if (attend::field_kind(field) != attend::FieldKind::boolean) {
      std::string type(attend::to_string(attend::field_kind(field)));
      std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::toupper(c); });
      opt->type_name(type);
    }
    field_opts[i] = opt->check(parses_as(field))->group(g);
  }
  app.add_option("--window", f.window, "sliding window L,R (-1 = unbounded side)")
      ->group(g)
      ->excludes(field_opts[field_index("window_left")])
      ->excludes(field_opts[field_index("window_right")]);
  app.add_option("--bias", f.bias, "additive bias: none|full (B,H)|batch (B,1)|head (1,H)|shared (1,1)")
      ->check(CLI::IsMember({"none", "full", "batch", "head", "shared"}))
      ->group(g)
      ->capture_default_str();
  app.add_option("--varlen-q", f.varlen_q, "per-sequence query lengths, e.g. 3,0,5 (thd layout)")
      ->delimiter(',')->check(non_negative_int())->group(g);
  app.add_option("--varlen-kv", f.varlen_kv, "per-sequence key lengths, e.g. 4,0,6 (thd layout)")
      ->delimiter(',')->check(non_negative_int())->group(g);
  app.add_flag("--kv-cache", f.kv_cache,
               "K/V live in a paged attend::KVCache (inference): --seqlen-kv tokens per sequence, "
               "queries attend bottom-right aligned to each sequence's length")->group(g);
  f.page_size_opt = app.add_option("--page-size", f.page_size, "tokens per KV-cache page, a power of two")
                        ->check(pos)
                        ->group(g)
                        ->capture_default_str();
  app.add_option("--cache-seqlens", f.cache_seqlens, "per-sequence cached tokens, e.g. 900,17 [--seqlen-kv each]")
      ->delimiter(',')->check(non_negative_int())->group(g);
  app.add_option("--cache-leftpad", f.cache_leftpad, "per-sequence left padding of the cache, e.g. 0,5")
      ->delimiter(',')->check(non_negative_int())->group(g);
  app.add_flag("--no-lse", f.no_lse, "do not return the log-sum-exp (--need-lse=false)")
      ->group(g)
      ->excludes(field_opts[field_index("need_lse")]);

  const char* m = "Mode and policy";
  auto* tr = app.add_flag("--training", f.training, "forward and backward must be supported (default)")
                 ->group(m);
  auto* inf = app.add_flag("--inference", f.inference, "only forward must be supported")->group(m);
  tr->excludes(inf);
  inf->excludes(tr);
  app.add_option("--backend", f.backend,
                 "force this backend, or one of its variants as name:variant, e.g. flash:avx2 "
                 "(overrides ATTEND_BACKEND)")
      ->group(m);
  app.add_option("--disable", f.disable, "never use these backends, e.g. a,b (adds to ATTEND_DISABLE)")
      ->delimiter(',')->group(m);
  app.add_option("--isa", f.isa,
                 "widest CPU kernel family: avx512amx|avx512bf16|avx512|avx2|scalar, or avx512amx-emu "
                 "(AMX kernels on emulated tiles; overrides ATTEND_ISA)")
      ->group(m);
  app.add_option("--select", f.select,
                 "selection strategy: priority, or autotune (time the viable plans once per shape bucket; "
                 "overrides ATTEND_SELECT)")
      ->group(m);
  app.add_option("--tune-cache", f.tune_cache,
                 "autotune cache file, or off (overrides ATTEND_TUNE_CACHE; default ~/.cache/attend/autotune.json)")
      ->group(m);
}

namespace {

std::int64_t parse_window_side(std::string_view text, std::string_view whole) {
  std::int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty() || v < -1) {
    throw CLI::ValidationError("--window", "'" + std::string(whole) +
                                               "' is not L,R with integers >= -1 (-1 = unbounded)");
  }
  return v;
}

void set_varlen(const ProblemFlags& f, Problem& p) {
  p.lens_q = f.varlen_q.empty() ? f.varlen_kv : f.varlen_q;
  p.lens_kv = f.varlen_kv.empty() ? f.varlen_q : f.varlen_kv;
  if (p.lens_q.size() != p.lens_kv.size()) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--varlen-kv", std::to_string(p.lens_kv.size()) + " lengths",
                        "--varlen-q and --varlen-kv must list the same number of sequences (" +
                            std::to_string(p.lens_q.size()) + " query lengths given)");
  }
  const char* conflict = f.given("batch")            ? "--batch"
                         : f.seqlen_opt->count() > 0 ? "--seqlen"
                         : f.given("seqlen_q")       ? "--seqlen-q"
                         : f.given("seqlen_kv")      ? "--seqlen-kv"
                                                     : nullptr;
  if (conflict != nullptr) {
    throw attend::Error(attend::ErrorCode::invalid_argument, conflict, "given",
                        "with --varlen-q/--varlen-kv the batch is the number of lengths "
                        "and the sequence lengths are their maxima");
  }
  if (f.given("layout") && f.text("layout") != "thd") {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--layout", f.text("layout"),
                        "--varlen-q/--varlen-kv imply the packed thd layout");
  }
  auto& s = p.spec;
  s.layout = attend::Layout::thd;
  s.batch = static_cast<std::int64_t>(p.lens_q.size());
  s.seqlen_q = *std::max_element(p.lens_q.begin(), p.lens_q.end());
  s.seqlen_kv = *std::max_element(p.lens_kv.begin(), p.lens_kv.end());
  // Checked: lengths come from the command line and may sum past int64.
  s.total_q = 0;
  for (const std::int64_t len : p.lens_q) s.total_q = attend::detail::checked_add(s.total_q, len, "varlen-q total");
  s.total_kv = 0;
  for (const std::int64_t len : p.lens_kv) s.total_kv = attend::detail::checked_add(s.total_kv, len, "varlen-kv total");
}

void set_kv_cache(const ProblemFlags& f, Problem& p) {
  auto& s = p.spec;
  const auto fail = [](const char* field, const std::string& value, const std::string& why) {
    throw attend::Error(attend::ErrorCode::invalid_argument, field, value, why);
  };
  if (s.varlen()) fail("--kv-cache", "set", "queries over a KV cache are dense: drop --varlen-q/--varlen-kv");
  if (f.bias != "none") fail("--bias", f.bias, "a bias is not supported with --kv-cache");
  if ((f.page_size & (f.page_size - 1)) != 0) fail("--page-size", std::to_string(f.page_size), "must be a power of two");
  p.cache_lens = f.cache_seqlens;
  p.cache_pads = f.cache_leftpad;
  const auto per_sequence = [&](const std::vector<std::int64_t>& v, const char* flag, const char* what) {
    if (!v.empty() && static_cast<std::int64_t>(v.size()) != s.batch) {
      fail(flag, std::to_string(v.size()) + what, "needs one per sequence (--batch)");
    }
  };
  per_sequence(p.cache_lens, "--cache-seqlens", " lengths");
  per_sequence(p.cache_pads, "--cache-leftpad", " values");
  // An explicit --seqlen-kv (or --seqlen) is the longest sequence the cache holds.
  const std::int64_t explicit_kv = f.given("seqlen_kv") || f.seqlen_opt->count() > 0 ? s.seqlen_kv : 0;
  for (const std::int64_t len : p.cache_lens) {
    if (explicit_kv > 0 && len > explicit_kv) {
      fail("--cache-seqlens", std::to_string(len),
           "exceeds --seqlen-kv=" + std::to_string(explicit_kv) +
               ", the longest sequence the cache holds "
               "(leave --seqlen-kv out to size the cache from --cache-seqlens)");
    }
  }
  if (!p.cache_lens.empty() || !p.cache_pads.empty()) {  // then batch is the lists' length
    const std::int64_t default_len = s.seqlen_kv;
    s.seqlen_kv = 0;
    for (std::int64_t b = 0; b < s.batch; ++b) {
      const std::int64_t len = p.cache_lens.empty() ? default_len : p.cache_lens[static_cast<std::size_t>(b)];
      const std::int64_t pad = p.cache_pad(b);
      if (pad > len) fail("--cache-leftpad", std::to_string(pad), "exceeds sequence " + std::to_string(b) + "'s cached tokens");
      s.seqlen_kv = std::max(s.seqlen_kv, len - pad);
      s.kv_leftpad = s.kv_leftpad || pad > 0;
    }
    if (p.cache_lens.empty()) p.cache_lens.assign(static_cast<std::size_t>(s.batch), default_len);
  }
  s.kv_page_size = f.page_size;
}

// An 8-bit --kv-dtype without --kv-scale gets the scales the data is built
// with: a cache's own defaults (attend::KVCache: per_token for i8, per_head for
// fp8), per_token for dense K/V (quantized here from the whole tensor, so the
// tightest layout costs nothing to compute).
void set_kv_scale(const ProblemFlags& f, Problem& p) {
  auto& s = p.spec;
  if (!s.kv_quantized()) return;
  if (!f.given("kv_scale")) {
    s.kv_scale = f.kv_cache && s.effective_kv_dtype() != attend::DType::i8 ? attend::KVScale::per_head
                                                                           : attend::KVScale::per_token;
  } else if (f.kv_cache && s.kv_scale == attend::KVScale::none) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--kv-scale", "none",
                        "an 8-bit KV cache (--kv-dtype " + std::string(attend::to_string(s.effective_kv_dtype())) +
                            ") keeps scales: per_token, per_head or per_tensor");
  }
}

// Flags override the environment's policy field by field, and name themselves
// as the source, so an error points at what the user typed.
void apply_policy(const ProblemFlags& f, attend::Policy& policy) {
  if (!f.backend.empty()) {
    policy.force = f.backend;
    policy.force_source = "--backend";
  }
  bool disabled = false;
  for (const auto& name : f.disable) {
    if (name.empty()) continue;
    disabled = true;
    if (std::find(policy.disabled.begin(), policy.disabled.end(), name) == policy.disabled.end()) {
      policy.disabled.push_back(name);
    }
  }
  if (disabled) policy.disabled_source = "--disable";
  if (!f.isa.empty()) {
    policy.isa = f.isa;
    policy.isa_source = "--isa";
  }
  if (!f.select.empty()) {
    policy.strategy_source = "--select";
    policy.strategy = attend::parse_strategy(f.select, policy.strategy_source);
  }
  if (!f.tune_cache.empty()) policy.tune_cache = f.tune_cache;
  attend::validate_policy(policy);
}

}  // namespace

Problem make_problem(const ProblemFlags& f) {
  Problem p;
  auto& s = p.spec;
  s.seqlen_q = s.seqlen_kv = f.seqlen;
  s.heads_q = s.heads_kv = f.heads;
  s.head_dim_qk = s.head_dim_v = f.head_dim;
  for (std::size_t i = 0; i < f.fields.size(); ++i) {
    if (!f.fields[i].empty()) attend::set_field(s, attend::spec_fields()[i], f.fields[i]);
  }
  if (s.dtype == attend::DType::i32) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--dtype", f.text("dtype"),
                        "i32 is an index type; use f32, f64, bf16 or f16");
  }
  if (s.layout == attend::Layout::thd && f.varlen_q.empty() && f.varlen_kv.empty()) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--layout", f.text("layout"),
                        "the thd layout needs per-sequence lengths: give --varlen-q/--varlen-kv");
  }
  if (!f.varlen_q.empty() || !f.varlen_kv.empty()) set_varlen(f, p);
  if (f.kv_cache) {
    set_kv_cache(f, p);
  } else {
    const char* cache_flag = !f.cache_seqlens.empty()       ? "--cache-seqlens"
                             : !f.cache_leftpad.empty()     ? "--cache-leftpad"
                             : f.page_size_opt->count() > 0 ? "--page-size"
                                                            : nullptr;
    if (cache_flag != nullptr) {
      throw attend::Error(attend::ErrorCode::invalid_argument, cache_flag, "given",
                          "--page-size/--cache-seqlens/--cache-leftpad describe a KV cache: add --kv-cache");
    }
  }
  if (!f.window.empty()) {
    const auto comma = f.window.find(',');
    if (comma == std::string::npos) {
      throw CLI::ValidationError("--window", "'" + f.window + "' is not L,R (e.g. 128,0)");
    }
    s.window_left = parse_window_side(std::string_view(f.window).substr(0, comma), f.window);
    s.window_right = parse_window_side(std::string_view(f.window).substr(comma + 1), f.window);
  }
  if (f.bias != "none") {
    s.has_bias = true;
    p.bias_batch = (f.bias == "full" || f.bias == "batch") ? s.batch : 1;
    p.bias_heads = (f.bias == "full" || f.bias == "head") ? s.heads_q : 1;
  }
  if (s.bias_requires_grad && !s.has_bias) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--bias-grad", "set",
                        "needs a bias: add --bias full|batch|head|shared");
  }
  if (f.no_lse) s.need_lse = false;
  set_kv_scale(f, p);
  // A KV cache and 8-bit K/V are inference-only, so --kv-cache and an 8-bit
  // --kv-dtype default to --inference; an explicit --training then fails
  // selection with every backend's reason.
  const bool forward_only = f.kv_cache || s.kv_quantized();
  p.mode = (f.inference || (forward_only && !f.training)) ? attend::Mode::inference : attend::Mode::training;
  attend::validate(s);

  p.policy = attend::Policy::from_env();
  apply_policy(f, p.policy);
  return p;
}

void sizes_from_files(ProblemFlags& f, const DataSources& src) {
  const auto dims = [](const NpyInput& in) {
    return in.tensor.defined() && in.tensor.view().ndim == 4
               ? Shape(in.tensor.view().shape.begin(), in.tensor.view().shape.begin() + 4)
               : Shape{};
  };
  const Shape q = dims(src.q), k = dims(src.k), v = dims(src.v);
  if (q.empty() || k.empty() || v.empty() || !f.varlen_q.empty() || !f.varlen_kv.empty()) return;
  // Positions of (batch, seq, heads) in each layout; a KV cache takes (B, S, Hkv, D).
  const auto axes = [](const std::string& layout) -> std::array<std::size_t, 3> {
    if (layout == "bhsd") return {0, 2, 1};
    if (layout == "sbhd") return {1, 0, 2};
    return {0, 1, 2};
  };
  const auto aq = axes(f.text("layout")), akv = f.kv_cache ? axes("bshd") : aq;
  const auto fill = [&f](std::string_view field, std::int64_t size) {
    if (!f.given(field)) f.set_text(field, std::to_string(size));
  };
  fill("batch", q[aq[0]]);
  if (f.seqlen_opt->count() == 0) {
    fill("seqlen_q", q[aq[1]]);
    if (f.cache_seqlens.empty()) fill("seqlen_kv", k[akv[1]]);
  }
  if (f.heads_opt->count() == 0) {
    fill("heads_q", q[aq[2]]);
    fill("heads_kv", k[akv[2]]);
  }
  if (f.head_dim_opt->count() == 0) {
    fill("head_dim_qk", q[3]);
    fill("head_dim_v", v[3]);
  }
}

ProblemParser::ProblemParser() : app_(std::make_unique<CLI::App>("problem flags", "attend")) {
  add_problem_flags(*app_, flags_);
  defaults_ = flags_;  // the values (and option handles) before any parse
}

ProblemParser::~ProblemParser() = default;

Problem ProblemParser::parse(std::vector<std::string> args) {
  flags_ = defaults_;
  app_->clear();
  std::reverse(args.begin(), args.end());  // CLI11 consumes the vector from the back
  app_->parse(args);
  return make_problem(flags_);
}

Problem parse_problem_args(std::vector<std::string> args) { return ProblemParser().parse(std::move(args)); }

std::string describe_mode(attend::Mode mode) {
  return mode == attend::Mode::training ? "training (forward and backward must be supported)"
                                        : "inference (forward only)";
}

}  // namespace attend_cli
