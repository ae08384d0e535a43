// Internal: the gate between a call and a kernel, shared by
// Backend::forward/backward and plans — the support check, workspace
// provisioning and allocation-error translation.
#pragma once

#include <cstddef>
#include <new>
#include <string>
#include <string_view>

#include "attend/backend.h"
#include "attend/error.h"
#include "runtime/uncovered_rows.h"

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

// The one gate into a kernel: workspace (the caller's, checked for size, or
// allocated for the call from `allocator`), then `kernel(args)`, whose own
// allocation failures become attend::Error. Support was decided before:
// require_support (Backend's entry) or the selection a plan was made from.
// Rows of a packed batch outside every sequence are defined here, after any
// backend's kernel, rather than in each kernel.
template <class Args, class Kernel>
void run_gated(std::string_view backend, Pass pass, Args args, std::size_t scratch, Allocator* allocator,
               Kernel&& kernel) {
  const ScopedWorkspace ws(scratch, args.workspace, allocator, args.target.device, backend, pass);
  args.workspace = ws.ws;
  with_alloc_errors(backend, pass, [&] { kernel(args); });
  define_uncovered_rows(args);
}

}  // namespace attend::detail
