#include "runtime/host_memory.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace attend::detail {

namespace {

// Whole huge pages; a size within one page of SIZE_MAX is left as it is (its
// allocation fails either way, with std::bad_alloc rather than a wrapped size).
std::size_t huge_size(std::size_t bytes) {
  return bytes > SIZE_MAX - kHugePageBytes ? bytes : (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

}  // namespace

bool huge_pages_advised() {
  static const bool on = [] {
    const char* v = std::getenv("ATTEND_HUGE_PAGES");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

bool huge_block(std::size_t bytes) { return bytes >= kHugePageBytes && huge_pages_advised(); }

void* host_allocate(std::size_t bytes) {
  if (!huge_block(bytes)) return ::operator new (bytes, std::align_val_t{64});
  const std::size_t size = huge_size(bytes);
  void* p = ::operator new (size, std::align_val_t{kHugePageBytes});
#if defined(__linux__)
  // Advice only: where the kernel declines it, the pages stay 4 KiB.
  (void)madvise(p, size, MADV_HUGEPAGE);
#endif
  return p;
}

void host_free(void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) return;
  if (!huge_block(bytes)) {
    ::operator delete (ptr, std::align_val_t{64});
  } else {
    ::operator delete (ptr, std::align_val_t{kHugePageBytes});
  }
}

}  // namespace attend::detail
