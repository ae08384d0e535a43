#include "attend/registry.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <string>

#include "attend/error.h"
#include "runtime/builtin.h"

namespace attend {

struct Registry::State {
  mutable std::mutex mutex;
  std::vector<RegisteredBackend> backends;
  std::atomic<std::uint64_t> generation{1};

  void sort() {
    std::stable_sort(backends.begin(), backends.end(), [](const auto& a, const auto& b) {
      if (a.priority != b.priority) return a.priority > b.priority;
      return a.backend->name() < b.backend->name();
    });
  }
};

// The built-in list comes from the backend folders (runtime/builtin.h): the
// registry names no backend.
Registry::Registry() : state_(std::make_shared<State>()) {
  state_->backends = detail::builtin_backends();
  state_->sort();
}

Registry& Registry::global() {
  static Registry registry;
  return registry;
}

void Registry::register_backend(std::shared_ptr<const Backend> backend, int priority) {
  if (!backend) throw Error(ErrorCode::invalid_argument, "backend", "null", "cannot register a null backend");
  if (backend->name().empty()) {
    throw Error(ErrorCode::invalid_argument, "backend.name", "\"\"", "a backend needs a name");
  }
  std::lock_guard lock(state_->mutex);
  auto& list = state_->backends;
  std::erase_if(list, [&](const auto& e) { return e.backend->name() == backend->name(); });
  list.push_back({std::move(backend), priority});
  state_->sort();
  state_->generation.fetch_add(1);
}

bool Registry::unregister_backend(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  const auto removed = std::erase_if(state_->backends, [&](const auto& e) { return e.backend->name() == name; });
  if (removed) state_->generation.fetch_add(1);
  return removed > 0;
}

std::vector<RegisteredBackend> Registry::backends() const {
  std::lock_guard lock(state_->mutex);
  return state_->backends;
}

std::shared_ptr<const Backend> Registry::find(std::string_view name) const {
  std::lock_guard lock(state_->mutex);
  for (const auto& e : state_->backends) {
    if (e.backend->name() == name) return e.backend;
  }
  return nullptr;
}

std::uint64_t Registry::generation() const { return state_->generation.load(); }

void Registry::reset_to_builtins() {
  std::lock_guard lock(state_->mutex);
  state_->backends = detail::builtin_backends();
  state_->sort();
  state_->generation.fetch_add(1);
}

void register_backend(std::shared_ptr<const Backend> backend, int priority) {
  Registry::global().register_backend(std::move(backend), priority);
}

}  // namespace attend
