// Internal: the pieces of Backend::forward/backward that plans reuse — the
// support gate, workspace provisioning and allocation-error translation.
#pragma once

#include <cstddef>
#include <new>
#include <string>
#include <string_view>

#include "attend/backend.h"
#include "attend/error.h"

namespace attend::detail {

// The gate every kernel passes through: the backend's own check decides.
void require_support(const Backend& backend, const AttentionSpec& spec, Pass pass, const Target& target);

// A caller-provided workspace must be large enough; without one, the call
// allocates its own (from `allocator`, default host) for its duration.
class ScopedWorkspace {
 public:
  ScopedWorkspace(std::size_t need, const Workspace& given, Allocator* allocator, Device device,
                  std::string_view backend, Pass pass);
  ~ScopedWorkspace();
  ScopedWorkspace(const ScopedWorkspace&) = delete;
  ScopedWorkspace& operator=(const ScopedWorkspace&) = delete;
  Workspace ws;

 private:
  Allocator* alloc_ = nullptr;
  Device device_{};
};

// A kernel's own allocations (task lists, per-call buffers) may fail too; the
// caller gets an attend::Error, whichever backend it was, never std::bad_alloc.
template <typename Fn>
void with_alloc_errors(std::string_view backend, Pass pass, Fn&& fn) {
  try {
    fn();
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::out_of_memory, "backend", std::string(backend),
                std::string(to_string(pass)) + " could not allocate its buffers");
  }
}

}  // namespace attend::detail
