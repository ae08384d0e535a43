// The selector: one pass over the registered backends, in priority order, asking
// each for every pass the mode needs. Readable top to bottom on purpose.
#include "attend/select.h"

#include <algorithm>
#include <iostream>
#include <mutex>
#include <string>
#include <unordered_map>

#include "attend/error.h"
#include "attend/registry.h"
#include "core/policy_state.h"
#include "core/select_cache.h"

namespace attend {

namespace {

struct Cache {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const Selection>> entries;
};

Cache& cache() {
  static Cache c;
  return c;
}

// Bounded so that a long run over ever-changing shapes cannot grow without limit.
constexpr std::size_t kMaxCachedSelections = 4096;

std::string registered_names(const std::vector<RegisteredBackend>& entries) {
  std::string s;
  for (const auto& e : entries) s += (s.empty() ? "" : ", ") + std::string(e.backend->name());
  return s;
}

void require_known(const std::vector<RegisteredBackend>& entries, const std::string& name,
                   const char* field) {
  for (const auto& e : entries) {
    if (e.backend->name() == name) return;
  }
  throw Error(ErrorCode::invalid_argument, field, name,
              "no registered backend has this name (registered: " + registered_names(entries) + ")");
}

std::shared_ptr<Selection> evaluate_all(const AttentionSpec& spec, Mode mode, const Policy& policy) {
  const std::vector<RegisteredBackend> entries = Registry::global().backends();
  if (policy.force) require_known(entries, *policy.force, "ATTEND_BACKEND");
  for (const auto& d : policy.disabled) require_known(entries, d, "ATTEND_DISABLE");

  auto sel = std::make_shared<Selection>();
  sel->mode = mode;
  sel->spec_summary = describe(spec);
  for (const auto& e : entries) {
    Verdict v;
    v.backend = std::string(e.backend->name());
    v.priority = e.priority;
    v.disabled = std::find(policy.disabled.begin(), policy.disabled.end(), v.backend) != policy.disabled.end();
    v.not_forced = policy.force && *policy.force != v.backend;
    v.forward = e.backend->check(spec, Pass::forward);
    if (mode == Mode::training) v.backward = e.backend->check(spec, Pass::backward);
    v.viable = !v.disabled && !v.not_forced && v.forward.ok() && (!v.backward || v.backward->ok());
    if (v.viable && !sel->backend) {
      v.chosen = true;
      sel->backend = e.backend;
    }
    sel->verdicts.push_back(std::move(v));
  }
  return sel;
}

std::shared_ptr<const Selection> compute(const AttentionSpec& spec, Mode mode, const Policy& policy) {
  std::shared_ptr<Selection> sel = evaluate_all(spec, mode, policy);
  if (!sel->backend) {
    const std::string what = policy.force
        ? "forced backend '" + *policy.force + "' cannot run this problem in " + std::string(to_string(mode)) + " mode"
        : "no registered backend can run this problem in " + std::string(to_string(mode)) + " mode";
    throw Error(ErrorCode::unsupported, policy.force ? "ATTEND_BACKEND" : "backend",
                policy.force ? *policy.force : "none", what + "\n" + sel->explain());
  }
  return sel;
}

}  // namespace

namespace detail {

std::shared_ptr<const Selection> select_shared(const AttentionSpec& spec, Mode mode, const Policy& policy) {
  validate(spec);
  const std::string key = signature(spec) + '|' + std::string(to_string(mode)) + '|' +
                          policy_key(policy) + '|' + std::to_string(Registry::global().generation());
  Cache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    if (auto it = c.entries.find(key); it != c.entries.end()) {
      if (policy.log == LogLevel::debug) {
        std::cerr << "[attend] " << it->second->backend->name() << " (cached) for "
                  << it->second->spec_summary << " [" << to_string(mode) << "]\n";
      }
      return it->second;
    }
  }
  // Checks run outside the lock: they are pure, and a user backend's check may be slow.
  std::shared_ptr<const Selection> sel = compute(spec, mode, policy);
  if (policy.log != LogLevel::off) std::cerr << "[attend] new selection\n" << sel->explain();
  std::lock_guard lock(c.mutex);
  if (c.entries.size() >= kMaxCachedSelections) c.entries.clear();
  c.entries.emplace(key, sel);
  return sel;
}

}  // namespace detail

Selection select(const AttentionSpec& spec, Mode mode, const Policy& policy) {
  return *detail::select_shared(spec, mode, policy);
}

Selection evaluate(const AttentionSpec& spec, Mode mode, const Policy& policy) {
  validate(spec);
  return *evaluate_all(spec, mode, policy);
}

Selection select(const AttentionSpec& spec, Mode mode) { return select(spec, mode, current_policy()); }

void clear_selection_cache() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  c.entries.clear();
}

}  // namespace attend
