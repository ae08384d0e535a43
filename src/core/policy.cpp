#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>

#include "attend/error.h"
#include "attend/select.h"
#include "core/policy_state.h"

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

struct PolicyState {
  std::mutex mutex;
  bool initialised = false;
  Policy policy;
};

PolicyState& state() {
  static PolicyState s;
  return s;
}

}  // namespace

Policy Policy::from_env() {
  Policy p;
  if (const char* force = std::getenv("ATTEND_BACKEND"); force && *force) p.force = force;
  if (const char* disabled = std::getenv("ATTEND_DISABLE")) p.disabled = split_list(disabled);
  if (const char* log = std::getenv("ATTEND_LOG"); log && *log) {
    const std::string_view v(log);
    if (v == "info") p.log = LogLevel::info;
    else if (v == "debug") p.log = LogLevel::debug;
    else if (v == "off" || v == "0") p.log = LogLevel::off;
    else throw Error(ErrorCode::invalid_argument, "ATTEND_LOG", std::string(v), "expected off, info or debug");
  }
  return p;
}

Policy current_policy() {
  PolicyState& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.initialised) {
    s.policy = Policy::from_env();
    s.initialised = true;
  }
  return s.policy;
}

void set_policy(Policy policy) {
  PolicyState& s = state();
  {
    std::lock_guard lock(s.mutex);
    s.policy = std::move(policy);
    s.initialised = true;
  }
  clear_selection_cache();
}

namespace detail {
std::string policy_key(const Policy& p) {
  std::string key = p.force ? "force=" + *p.force : "auto";
  for (const auto& d : p.disabled) key += ",-" + d;
  key += ",log=" + std::to_string(static_cast<int>(p.log));
  return key;
}
}  // namespace detail

}  // namespace attend
