// How a backend folder registers itself. Each src/backends/<name>/ defines
//
//   namespace attend::backends { void register_<name>(detail::BuiltinBackends& list); }
//
// and CMake (cmake/AttendBackends.cmake) generates the function that calls the
// register_* of every folder in the build's backend list, so the runtime
// includes no backend header and adding a backend touches no runtime file.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "attend/registry.h"

namespace attend::detail {

struct BuiltinBackends {
  std::vector<RegisteredBackend> entries;
  void add(std::shared_ptr<const Backend> backend, int priority) { entries.push_back({std::move(backend), priority}); }
};

// Generated: every built-in backend with its default priority.
std::vector<RegisteredBackend> builtin_backends();

}  // namespace attend::detail
