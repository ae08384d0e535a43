#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "attend/error.h"
#include "attend/registry.h"
#include "attend/select.h"
#include "attend/thread_policy.h"
#include "cpu/isa.h"
#include "runtime/policy_state.h"

namespace attend {

namespace {

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream is{std::string(text)};
  while (std::getline(is, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

std::shared_ptr<const detail::PolicySnapshot> make_snapshot(Policy policy) {
  static std::atomic<std::uint64_t> next_id{1};
  auto s = std::make_shared<detail::PolicySnapshot>();
  s->key = detail::policy_key(policy);
  s->id = next_id.fetch_add(1);
  // An invalid ATTEND_ISA is reported when it is used (selection), not here:
  // a process that never selects must not fail because of it.
  try {
    s->isa_cap = detail::isa_cap(policy);
  } catch (const Error&) {
    s->isa_cap = -2;  // isa_cap() is asked again, and throws, at use
  }
  s->policy = std::move(policy);
  return s;
}

struct PolicyState {
  std::mutex mutex;
  std::shared_ptr<const detail::PolicySnapshot> snapshot;
};

PolicyState& state() {
  static PolicyState s;
  return s;
}

// This thread's pushed policies, innermost last.
thread_local std::vector<std::shared_ptr<const detail::PolicySnapshot>> thread_policies;

std::string registered_names() {
  std::string s;
  for (const auto& e : Registry::global().backends()) s += (s.empty() ? "" : ", ") + std::string(e.backend->name());
  return s;
}

}  // namespace

std::string_view to_string(Strategy strategy) { return strategy == Strategy::autotune ? "autotune" : "priority"; }

Strategy parse_strategy(std::string_view text, const std::string& source) {
  if (text == "priority") return Strategy::priority;
  if (text == "autotune") return Strategy::autotune;
  throw Error(ErrorCode::invalid_argument, source, std::string(text), "expected priority or autotune");
}

namespace {

// The autotune cache is one JSON file: a directory there would fail only at
// the first autotuned call, as a raw stream error from inside the JSON reader.
void check_tune_cache(const char* source, const std::string& configured) {
  if (configured.empty() || configured == "off") return;  // the default path, or none
  std::error_code ec;
  if (std::filesystem::is_directory(configured, ec)) {
    throw Error(ErrorCode::invalid_argument, source, configured,
                "is a directory: the autotune cache is a JSON file (give a file path, or 'off')");
  }
}

}  // namespace

Policy Policy::from_env() {
  Policy p;
  p.force_source = "ATTEND_BACKEND";
  p.disabled_source = "ATTEND_DISABLE";
  p.isa_source = "ATTEND_ISA";
  if (const char* force = std::getenv("ATTEND_BACKEND"); force && *force) p.force = force;
  if (const char* disabled = std::getenv("ATTEND_DISABLE")) p.disabled = split_list(disabled);
  if (const char* isa = std::getenv("ATTEND_ISA"); isa && *isa) p.isa = isa;
  if (const char* sel = std::getenv("ATTEND_SELECT"); sel && *sel) {
    p.strategy_source = "ATTEND_SELECT";
    p.strategy = parse_strategy(sel, p.strategy_source);
  }
  if (const char* cache = std::getenv("ATTEND_TUNE_CACHE")) {
    p.tune_cache = cache;
    check_tune_cache("ATTEND_TUNE_CACHE", p.tune_cache);
  }
  if (const char* log = std::getenv("ATTEND_LOG"); log && *log) {
    const std::string_view v(log);
    if (v == "info")
      p.log = LogLevel::info;
    else if (v == "debug")
      p.log = LogLevel::debug;
    else if (v == "off" || v == "0")
      p.log = LogLevel::off;
    else
      throw Error(ErrorCode::invalid_argument, "ATTEND_LOG", std::string(v), "expected off, info or debug");
  }
  return p;
}

void validate_policy(const Policy& p) {
  const Registry& reg = Registry::global();
  if (p.force) {
    const std::string& f = *p.force;
    const auto colon = f.find(':');
    const std::string name = f.substr(0, colon);
    const auto backend = reg.find(name);
    if (!backend) {
      throw Error(ErrorCode::invalid_argument, p.force_source, f,
                  "no registered backend has this name (registered: " + registered_names() + ")");
    }
    if (colon != std::string::npos && backend->find_variant(std::string_view(f).substr(colon + 1)) < 0) {
      std::string names;
      for (const Variant& v : backend->variants()) names += (names.empty() ? "" : ", ") + v.name;
      throw Error(ErrorCode::invalid_argument, p.force_source, f,
                  "backend " + name + " has no such variant (variants: " + names + ")");
    }
  }
  for (const auto& d : p.disabled) {
    if (!reg.find(d)) {
      throw Error(ErrorCode::invalid_argument, p.disabled_source, d,
                  "no registered backend has this name (registered: " + registered_names() + ")");
    }
  }
  (void)detail::isa_cap(p);
  check_tune_cache("tune_cache", p.tune_cache);
}

Policy current_policy() { return detail::policy_snapshot()->policy; }

void set_policy(Policy policy) {
  validate_policy(policy);
  auto snap = make_snapshot(std::move(policy));
  {
    PolicyState& s = state();
    std::lock_guard lock(s.mutex);
    s.snapshot = std::move(snap);
  }
  clear_selection_cache();
}

std::uint64_t push_thread_policy(Policy policy) {
  validate_policy(policy);
  // A fresh snapshot has a fresh id (the token): selections cached under
  // another policy are not reused, and none need clearing.
  thread_policies.push_back(make_snapshot(std::move(policy)));
  return thread_policies.back()->id;
}

void pop_thread_policy(std::uint64_t token) {
  const auto it =
      std::find_if(thread_policies.begin(), thread_policies.end(), [token](const auto& s) { return s->id == token; });
  if (it == thread_policies.end()) {
    throw Error(ErrorCode::bad_state, "thread policy", std::to_string(token),
                "this thread holds no such policy (popped already, or pushed on another thread)");
  }
  thread_policies.erase(it);
}

namespace detail {

std::shared_ptr<const PolicySnapshot> policy_snapshot() {
  if (!thread_policies.empty()) return thread_policies.back();
  PolicyState& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.snapshot) s.snapshot = make_snapshot(Policy::from_env());
  return s.snapshot;
}

std::string policy_key(const Policy& p) {
  std::string key = p.force ? "force=" + *p.force : "auto";
  for (const auto& d : p.disabled) key += ",-" + d;
  if (p.isa) key += ",isa=" + *p.isa;
  key += ",log=" + std::to_string(static_cast<int>(p.log));
  if (p.strategy == Strategy::autotune) key += ",autotune=" + p.tune_cache;
  return key;
}

int isa_cap(const Policy& p) {
  if (!p.isa) return static_cast<int>(cpu::Isa::avx512amx);
  if (*p.isa == cpu::kAmxEmulated) {
    if (!cpu::supports(cpu::Isa::avx512bf16)) {
      throw Error(ErrorCode::unsupported, p.isa_source, *p.isa,
                  "the emulated AMX tiles run on AVX512-BF16, and " + std::string(cpu::missing(cpu::Isa::avx512bf16)));
    }
    return static_cast<int>(cpu::Isa::avx512amx);
  }
  const auto isa = cpu::parse_isa(*p.isa);
  if (!isa) {
    throw Error(ErrorCode::invalid_argument, p.isa_source, *p.isa, "expected " + std::string(cpu::isa_names()));
  }
  if (!cpu::supports(*isa)) {
    throw Error(ErrorCode::unsupported, p.isa_source, *p.isa,
                "this CPU does not support that instruction set (" + std::string(cpu::missing(*isa)) + ")");
  }
  return static_cast<int>(*isa);
}

int isa_cap(const PolicySnapshot& snap) { return snap.isa_cap >= -1 ? snap.isa_cap : isa_cap(snap.policy); }

bool isa_names_variant(const Policy& p, std::span<const Variant> all) {
  return p.isa &&
         std::any_of(all.begin(), all.end(), [&](const Variant& v) { return v.on_request && v.name == *p.isa; });
}

VariantBar variant_bar(const Variant& v, const Policy& p, bool named, int cap, bool forced) {
  if (!v.unavailable.empty()) return VariantBar::unavailable;
  if (named) return v.name == *p.isa ? VariantBar::none : VariantBar::alone;
  if (v.on_request && !forced) return VariantBar::on_request;
  return v.isa_level > cap ? VariantBar::above_cap : VariantBar::none;
}

}  // namespace detail

}  // namespace attend
