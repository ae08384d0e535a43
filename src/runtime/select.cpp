// The selector: one pass over the registered backends in priority order and
// over each backend's variants in its own order, asking each (backend, variant)
// for every pass the mode needs. Readable top to bottom on purpose.
#include "attend/select.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>
#include <unordered_map>

#include "attend/error.h"
#include "attend/registry.h"
#include "attend/spec_fields.h"
#include "runtime/autotune.h"
#include "runtime/policy_state.h"
#include "runtime/select_cache.h"

namespace attend {

namespace {

// --- evaluation ------------------------------------------------------------------

struct Forced {
  std::string backend, variant;  // variant empty: any
};

Forced parse_force(const Policy& policy) {
  if (!policy.force) return {};
  const std::string& f = *policy.force;
  const auto colon = f.find(':');
  if (colon == std::string::npos) return {f, ""};
  return {f.substr(0, colon), f.substr(colon + 1)};
}

std::shared_ptr<Selection> evaluate_all(const AttentionSpec& spec, Mode mode, const Policy& policy, Device device,
                                        std::vector<detail::Candidate>* candidates) {
  validate_policy(policy);
  const int cap = detail::isa_cap(policy);
  const Forced forced = parse_force(policy);
  auto sel = std::make_shared<Selection>();
  sel->mode = mode;
  sel->device = device;
  sel->spec_summary = describe(spec);
  for (const auto& e : Registry::global().backends()) {
    const std::string name(e.backend->name());
    const auto variants = e.backend->variants();
    const bool disabled = std::find(policy.disabled.begin(), policy.disabled.end(), name) != policy.disabled.end();
    const bool named = detail::isa_names_variant(policy, variants);
    for (std::size_t i = 0; i < variants.size(); ++i) {
      const Variant& var = variants[i];
      Verdict v;
      v.backend = name;
      v.variant = var.name;
      v.priority = e.priority;
      v.disabled = disabled;
      v.not_forced =
          policy.force && (forced.backend != name || (!forced.variant.empty() && forced.variant != var.name));
      const bool forced_by_name = forced.backend == name && forced.variant == var.name;
      switch (detail::variant_bar(var, policy, named, cap, forced_by_name)) {
        case detail::VariantBar::unavailable: v.variant_excluded = var.unavailable; break;
        case detail::VariantBar::alone:
          v.variant_excluded = policy.isa_source + "=" + *policy.isa + " runs that kernel family alone";
          break;
        case detail::VariantBar::on_request:
          v.variant_excluded =
              "runs only where ATTEND_ISA=" + var.name + " (or --backend " + name + ":" + var.name + ") asks for it";
          break;
        case detail::VariantBar::above_cap:
          v.variant_excluded = policy.isa_source + "=" + *policy.isa + " excludes this kernel family";
          break;
        case detail::VariantBar::none: break;
      }
      const Target target{device, static_cast<int>(i)};
      v.forward = e.backend->check(spec, Pass::forward, target);
      if (mode == Mode::training) v.backward = e.backend->check(spec, Pass::backward, target);
      const bool eligible = !v.disabled && !v.not_forced && v.variant_excluded.empty();
      v.viable = eligible && v.forward.ok() && (!v.backward || v.backward->ok());
      if (v.viable) (void)e.backend->defers(spec, mode, target, &v.deferred);
      if (candidates) candidates->push_back({e.backend, static_cast<int>(i), eligible});
      sel->verdicts.push_back(std::move(v));
    }
  }
  // Priority: the first viable plan that does not defer, else the first viable one.
  const std::size_t none = sel->verdicts.size();
  std::size_t chosen = none, fallback = none;
  for (std::size_t i = 0; i < sel->verdicts.size() && chosen == none; ++i) {
    const Verdict& v = sel->verdicts[i];
    if (!v.viable) continue;
    if (v.deferred.empty())
      chosen = i;
    else if (fallback == none)
      fallback = i;
  }
  if (chosen == none) chosen = fallback;
  if (chosen != none) {
    Verdict& v = sel->verdicts[chosen];
    v.chosen = true;
    sel->backend = Registry::global().find(v.backend);
    sel->variant = sel->backend->find_variant(v.variant);
  }
  return sel;
}

// The strategy's final say on an evaluated selection.
void apply_strategy(Selection& sel, const AttentionSpec& spec, const Policy& policy, detail::Measure measure) {
  if (policy.strategy == Strategy::autotune && sel.backend) detail::apply_autotune(sel, spec, policy, measure);
}

[[noreturn]] void throw_unfit(const Selection& sel, const Policy& policy) {
  const std::string mode(to_string(sel.mode));
  const std::string what = policy.force
                               ? "forced backend '" + *policy.force + "' cannot run this problem in " + mode + " mode"
                               : "no registered backend can run this problem in " + mode + " mode";
  throw Error(ErrorCode::unsupported, policy.force ? policy.force_source : "backend",
              policy.force ? *policy.force : "none", what + "\n" + sel.explain());
}

// --- the cache ---------------------------------------------------------------------

// The key: every selecting spec field as one word (bucketed sizes by their
// power-of-two bucket), then mode, device, policy and registry generation.
// Fixed size and built without allocating, so a cache hit allocates nothing.
constexpr std::size_t kKeyWords = 48;
struct Key {
  std::array<std::uint64_t, kKeyWords> w{};
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (std::uint64_t x : k.w) h = (h ^ x) * 1099511628211ull;
    return static_cast<std::size_t>(h);
  }
};

std::uint64_t word(const AttentionSpec& s, const SpecField& f) {
  return std::visit(
      [&](auto member) -> std::uint64_t {
        const auto& v = s.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, double>)
          return std::bit_cast<std::uint64_t>(v);
        else if constexpr (std::is_same_v<T, std::optional<double>>)
          return v ? std::bit_cast<std::uint64_t>(*v) : 0x7ff8dead0000beefull;
        else if constexpr (std::is_same_v<T, std::optional<DType>>)
          return v ? static_cast<std::uint64_t>(*v) + 1 : 0;
        else if constexpr (std::is_same_v<T, std::int64_t>) {
          if (f.key == KeyUse::bucket)
            return v <= 0 ? static_cast<std::uint64_t>(v)
                          : std::bit_width(static_cast<std::uint64_t>(v - 1)) + (std::uint64_t{1} << 62);
          return static_cast<std::uint64_t>(v);
        } else {
          return static_cast<std::uint64_t>(v);
        }
      },
      f.member);
}

Key make_key(const AttentionSpec& s, Mode mode, Device device, std::uint64_t policy_id, std::uint64_t generation) {
  static_assert(kKeyWords >= 4, "room for mode, device, policy, generation");
  Key k;
  std::size_t n = 0;
  for (const SpecField& f : spec_fields()) {
    if (f.key == KeyUse::none) continue;
    k.w[n++] = word(s, f);
  }
  k.w[n++] = static_cast<std::uint64_t>(mode);
  k.w[n++] = (static_cast<std::uint64_t>(device.kind) << 32) | static_cast<std::uint32_t>(device.index);
  k.w[n++] = policy_id;
  k.w[n++] = generation;
  return k;
}

struct Entry {
  std::shared_ptr<const Selection> selection;
  std::vector<detail::Candidate> candidates;  // every (backend, variant), in verdict order
  std::size_t chosen = 0;                     // index of the selected candidate
  bool tuned = false;                         // chosen by measured times, not priority
  AttentionSpec spec;                         // the problem it was computed for
};

struct Cache {
  std::mutex mutex;
  std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> entries;
};

Cache& cache() {
  static Cache c;
  return c;
}

// Bounded so that a long run over ever-changing shapes cannot grow without limit.
constexpr std::size_t kMaxCachedSelections = 4096;

bool same_problem(const AttentionSpec& a, const AttentionSpec& b) {
  for (const SpecField& f : spec_fields()) {
    if (f.key == KeyUse::none) continue;
    if (f.key == KeyUse::bucket) {
      const auto m = std::get<std::int64_t AttentionSpec::*>(f.member);  // buckets are sizes
      if (a.*m != b.*m) return false;
    } else if (word(a, f) != word(b, f)) {
      return false;
    }
  }
  return true;
}

// A cached choice made for another problem of the same bucket still holds for
// `spec` when every candidate ranked above it still declines and it still
// accepts: the checks re-run without text (Support::Detail::codes).
// A tuned choice holds while the winner still accepts: its time stands for the
// whole tuning bucket. A priority choice also needs the same speed preferences
// (Backend::defers) of the candidates ranked above it.
bool still_holds(const Entry& e, const AttentionSpec& spec, Mode mode, Device device) {
  const auto passes = [&](const detail::Candidate& c) {
    const Target t{device, c.variant};
    if (!c.backend->check(spec, Pass::forward, t, Support::Detail::codes).ok()) return false;
    return mode != Mode::training || c.backend->check(spec, Pass::backward, t, Support::Detail::codes).ok();
  };
  if (e.tuned) return passes(e.candidates[e.chosen]);
  std::size_t fallback = e.candidates.size();  // the first viable plan that defers
  for (std::size_t i = 0; i < e.candidates.size(); ++i) {
    const detail::Candidate& c = e.candidates[i];
    if (!c.eligible || !passes(c)) continue;
    if (!c.backend->defers(spec, mode, Target{device, c.variant})) return i == e.chosen;
    if (fallback == e.candidates.size()) fallback = i;
  }
  return fallback == e.chosen;
}

}  // namespace

std::string_view Selection::variant_name() const {
  if (!backend || variant < 0) return {};
  return backend->variants()[static_cast<std::size_t>(variant)].name;
}

namespace detail {

std::shared_ptr<const Selection> select_shared(const AttentionSpec& spec, Mode mode, const Policy* policy,
                                               Device device, bool spec_validated) {
  if (!spec_validated) validate(spec);
  // The process-wide policy is a snapshot (no copy); an explicit one is keyed by its text.
  std::shared_ptr<const PolicySnapshot> snap;
  std::uint64_t policy_id = 0;
  if (policy) {
    policy_id = std::hash<std::string>{}(policy_key(*policy)) | (std::uint64_t{1} << 63);
  } else {
    snap = policy_snapshot();
    policy_id = snap->id;
  }
  const Policy& pol = policy ? *policy : snap->policy;
  const Key key = make_key(spec, mode, device, policy_id, Registry::global().generation());
  Cache& c = cache();
  std::shared_ptr<const Entry> hit;
  {
    std::lock_guard lock(c.mutex);
    if (auto it = c.entries.find(key); it != c.entries.end()) hit = it->second;
  }
  if (hit && (same_problem(hit->spec, spec) || still_holds(*hit, spec, mode, device))) {
    if (pol.log == LogLevel::debug) {
      std::cerr << "[attend] " << hit->selection->backend->name() << ":" << hit->selection->variant_name()
                << " (cached) for " << describe(spec) << " [" << to_string(mode) << "]\n";
    }
    return hit->selection;
  }
  // Checks run outside the lock: they are pure, and a user backend's check may be slow.
  auto entry = std::make_shared<Entry>();
  std::shared_ptr<Selection> sel = evaluate_all(spec, mode, pol, device, &entry->candidates);
  if (!sel->backend) throw_unfit(*sel, pol);
  apply_strategy(*sel, spec, pol, detail::Measure::if_needed);
  for (std::size_t i = 0; i < sel->verdicts.size(); ++i) {
    if (sel->verdicts[i].chosen) entry->chosen = i;
  }
  entry->tuned = std::any_of(sel->verdicts.begin(), sel->verdicts.end(), [](const Verdict& v) { return v.seconds; });
  if (pol.log != LogLevel::off) std::cerr << "[attend] new selection\n" << sel->explain();
  entry->selection = sel;
  entry->spec = spec;
  std::lock_guard lock(c.mutex);
  if (c.entries.size() >= kMaxCachedSelections) c.entries.clear();
  c.entries.insert_or_assign(key, std::move(entry));
  return sel;
}

}  // namespace detail

Selection select(const AttentionSpec& spec, Mode mode, const Policy& policy, Device device) {
  std::shared_ptr<const Selection> sel = detail::select_shared(spec, mode, &policy, device);
  if (sel->spec_summary != describe(spec)) {
    const std::shared_ptr<Selection> own = evaluate_all(spec, mode, policy, device, nullptr);
    apply_strategy(*own, spec, policy, detail::Measure::if_needed);
    return *own;
  }
  return *sel;
}

Selection select(const AttentionSpec& spec, Mode mode) {
  const auto snap = detail::policy_snapshot();
  return select(spec, mode, snap->policy);
}

Selection evaluate(const AttentionSpec& spec, Mode mode, const Policy& policy, Device device) {
  validate(spec);
  const std::shared_ptr<Selection> sel = evaluate_all(spec, mode, policy, device, nullptr);
  apply_strategy(*sel, spec, policy, detail::Measure::never);
  return *sel;
}

void clear_selection_cache() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  c.entries.clear();
}

}  // namespace attend
