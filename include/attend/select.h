// Backend selection: which backend runs a problem, and why.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attend/backend.h"
#include "attend/spec.h"

namespace attend {

enum class LogLevel : std::uint8_t { off, info, debug };

// How select() chooses among the viable (backend, variant) plans.
//   priority: the highest registered priority, after the backends' speed
//             preferences (Backend::defers); no measurement.
//   autotune: the first problem of each tuning bucket times every viable plan
//             on scratch data of its shape and keeps the fastest, in memory and
//             in a persistent cache file (docs/autotune.md).
enum class Strategy : std::uint8_t { priority, autotune };
std::string_view to_string(Strategy strategy);
// "priority" or "autotune"; anything else is an attend::Error naming `source`.
Strategy parse_strategy(std::string_view text, const std::string& source = "strategy");

// User control over selection. The process-wide policy starts from the
// environment: ATTEND_BACKEND=name or name:variant (force; no silent fallback),
// ATTEND_DISABLE=a,b (remove backends), ATTEND_ISA=family (cap the CPU kernel
// families), ATTEND_LOG=info|debug (log selections to stderr),
// ATTEND_SELECT=priority|autotune (the strategy), ATTEND_TUNE_CACHE=path|off
// (the autotune cache file).
struct Policy {
  // Backend that must be used, optionally with one of its variants
  // ("flash" or "flash:avx2").
  std::optional<std::string> force;
  std::vector<std::string> disabled;  // backends never used
  // Widest CPU kernel family any backend may use: avx512amx, avx512bf16,
  // avx512, avx2 or scalar. A backend runs its best variant at or below it
  // (decode has no bf16-GEMM families: it runs avx512 under avx512amx). Naming
  // a family this CPU lacks is an attend::Error at selection.
  // avx512amx-emu is no cap but a request: flash runs its avx512amx kernels on
  // the emulated tile unit (exact, some 100x slower; any CPU with AVX512-BF16),
  // and every other backend as under avx512amx.
  std::optional<std::string> isa;
  LogLevel log = LogLevel::off;  // info: each new (spec, mode) once; debug: every call
  Strategy strategy = Strategy::priority;
  // Autotune's persistent cache: a JSON file path; "off": memory only; empty:
  // $XDG_CACHE_HOME/attend/autotune.json, else ~/.cache/attend/autotune.json.
  std::string tune_cache;
  // What set each field, for error messages ("ATTEND_BACKEND", "--backend",
  // "Policy::force"); from_env() and the CLI fill them, the default names the API.
  std::string force_source = "Policy::force";
  std::string disabled_source = "Policy::disabled";
  std::string isa_source = "Policy::isa";
  std::string strategy_source = "Policy::strategy";

  // Throws attend::Error for an unknown ATTEND_LOG or ATTEND_SELECT value.
  static Policy from_env();
};

// Throws attend::Error (naming the policy field's source) when `policy` names a
// backend, variant or ISA family that does not exist, or a family this CPU lacks.
void validate_policy(const Policy& policy);

// Process-wide policy. set_policy validates it first (an unknown backend is an
// error now, not at the next selection) and invalidates the selection cache.
Policy current_policy();
void set_policy(Policy policy);

// How one (backend, variant) fared for a problem.
struct Verdict {
  std::string backend;
  std::string variant;  // the backend's variant name ("default" if it has one)
  int priority = 0;
  bool disabled = false;            // removed by policy.disabled
  bool not_forced = false;          // another backend (or variant) is forced
  // Why the variant cannot be used here (the CPU lacks it, or policy.isa
  // excludes it); empty when it can. Its checks still run, for the record.
  std::string variant_excluded;
  // Non-empty: the backend defers on this problem (Backend::defers), so the
  // priority strategy ranks it after the viable backends that do not.
  std::string deferred;
  Support forward;                  // check(spec, forward, target)
  std::optional<Support> backward;  // check(spec, backward, target), training only
  bool viable = false;              // may run this mode
  bool chosen = false;
  // Autotune: median seconds of one run of the mode's passes (training:
  // forward + backward) on this problem's tuning bucket; unset when not timed.
  std::optional<double> seconds;
};

struct Selection {
  std::shared_ptr<const Backend> backend;  // never null in a returned Selection
  int variant = -1;                        // index into backend->variants()
  Device device{};                         // of the problem's tensors
  Mode mode = Mode::inference;
  std::string spec_summary;                // describe(spec)
  std::vector<Verdict> verdicts;           // one per (backend, variant), priority then variant order
  Strategy strategy = Strategy::priority;
  // Autotune: how the times were obtained ("measured now on ...", "from the
  // cache file ...") or why none were ("one viable plan: nothing to compare").
  std::string tuning;
  std::string_view variant_name() const;

  // A table: backend | variant | priority | forward | backward | verdict, then under each
  // backend its reasons ("- pass: ...") and the notes of its supported passes
  // ("note pass: ...", Support::notes).
  std::string explain() const;
  // The same content as JSON (for the CLI's --json and bindings).
  std::string to_json() const;
};

// Chooses, among the (backend, variant) plans that support every pass `mode`
// needs (training: forward and backward; inference: forward) and that `policy`
// allows, the highest-priority one (Strategy::priority) or the fastest measured
// one (Strategy::autotune; see attend/tune.h).
// Throws attend::Error(unsupported) — whose message contains the whole verdict
// table — when nothing fits or the forced backend cannot do the job.
// Results are cached per (signature(spec), mode, policy, registry generation).
Selection select(const AttentionSpec& spec, Mode mode);
Selection select(const AttentionSpec& spec, Mode mode, const Policy& policy, Device device = {});

// The same verdicts as select(), but never throws for "nothing fits": the
// returned Selection then has a null backend (explain() and to_json() still
// render every verdict). Not cached. For tools and bindings that show the table
// before (or instead of) running. Still throws for an invalid spec or policy.
Selection evaluate(const AttentionSpec& spec, Mode mode, const Policy& policy, Device device = {});

// Drops all cached selections (also done by set_policy and registry changes).
void clear_selection_cache();

}  // namespace attend
