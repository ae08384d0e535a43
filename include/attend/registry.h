// The set of backends the selector chooses from.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "attend/backend.h"

namespace attend {

struct RegisteredBackend {
  std::shared_ptr<const Backend> backend;
  int priority = 0;  // higher is preferred when several backends can run a problem
};

// Thread-safe. The global registry starts with the built-in backends; every
// change bumps generation(), which invalidates cached selections.
class Registry {
 public:
  static Registry& global();

  // Adds (or replaces, by name) a backend. Throws attend::Error for a null backend
  // or an empty name.
  void register_backend(std::shared_ptr<const Backend> backend, int priority);
  // Returns false when no backend has that name.
  bool unregister_backend(std::string_view name);
  // Snapshot ordered by priority (descending), then name.
  std::vector<RegisteredBackend> backends() const;
  std::shared_ptr<const Backend> find(std::string_view name) const;
  std::uint64_t generation() const;

  // Puts back exactly the built-in backends (used by tests).
  void reset_to_builtins();

 private:
  Registry();
  struct State;
  std::shared_ptr<State> state_;
};

// Convenience for Registry::global().register_backend.
void register_backend(std::shared_ptr<const Backend> backend, int priority);

}  // namespace attend
