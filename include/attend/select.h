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

// User control over selection. The process-wide policy starts from the
// environment: ATTEND_BACKEND=name (force; no silent fallback), ATTEND_DISABLE=a,b
// (remove backends), ATTEND_LOG=info|debug (log selections to stderr).
struct Policy {
  std::optional<std::string> force;  // backend that must be used
  std::vector<std::string> disabled; // backends never used
  LogLevel log = LogLevel::off;      // info: each new (spec, mode) once; debug: every call

  // Throws attend::Error for an unknown ATTEND_LOG value.
  static Policy from_env();
};

// Process-wide policy. set_policy invalidates the selection cache.
Policy current_policy();
void set_policy(Policy policy);

// How one backend fared for a problem.
struct Verdict {
  std::string backend;
  int priority = 0;
  bool disabled = false;            // removed by policy.disabled
  bool not_forced = false;          // another backend is forced
  Support forward;                  // check(spec, forward)
  std::optional<Support> backward;  // check(spec, backward), training only
  bool viable = false;              // may run this mode
  bool chosen = false;
};

struct Selection {
  std::shared_ptr<const Backend> backend;  // never null in a returned Selection
  Mode mode = Mode::inference;
  std::string spec_summary;                // describe(spec)
  std::vector<Verdict> verdicts;           // one per registered backend, priority order

  // A table: backend | priority | forward | backward | verdict, then under each
  // backend its reasons ("- pass: ...") and the notes of its supported passes
  // ("note pass: ...", Support::notes).
  std::string explain() const;
  // The same content as JSON (for the CLI's --json and bindings).
  std::string to_json() const;
};

// Chooses the highest-priority backend that supports every pass `mode` needs
// (training: forward and backward; inference: forward), honouring `policy`.
// Throws attend::Error(unsupported) — whose message contains the whole verdict
// table — when nothing fits or the forced backend cannot do the job.
// Results are cached per (signature(spec), mode, policy, registry generation).
Selection select(const AttentionSpec& spec, Mode mode);
Selection select(const AttentionSpec& spec, Mode mode, const Policy& policy);

// The same verdicts as select(), but never throws for "nothing fits": the
// returned Selection then has a null backend (explain() and to_json() still
// render every verdict). Not cached. For tools and bindings that show the table
// before (or instead of) running. Still throws for an invalid spec or policy.
Selection evaluate(const AttentionSpec& spec, Mode mode, const Policy& policy);

// Drops all cached selections (also done by set_policy and registry changes).
void clear_selection_cache();

}  // namespace attend
