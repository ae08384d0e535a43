// Host memory blocks for tensors, outputs and workspaces (Tensor::zeros and
// the host allocator).
//
// Blocks of kHugePageBytes and more are aligned to it and advised to the
// kernel as transparent huge pages (Linux MADV_HUGEPAGE; a no-op where THP is
// "never", redundant where it is "always"). Attention kernels read one head's
// rows H*D elements apart, 8 KiB at H=16, D=128, f32, so with 4 KiB pages
// every row is a TLB miss; decode streams a whole cache that way. Measured on
// the project's machine (THP in madvise mode, 2 threads): flash 1-16 % less
// time over 16 shapes (median 4 %), decode 2-12 % (docs/cpu_kernels.md).
// ATTEND_HUGE_PAGES=0 (read once) keeps 4 KiB pages.
#pragma once

#include <cstddef>

namespace attend::detail {

inline constexpr std::size_t kHugePageBytes = std::size_t{1} << 21;

// At least `bytes` (> 0) of uninitialised host memory, 64-byte aligned, and
// kHugePageBytes-aligned with the advice above when bytes >= kHugePageBytes.
// Throws std::bad_alloc.
void* host_allocate(std::size_t bytes);
// Frees a block of host_allocate with the same `bytes`.
void host_free(void* ptr, std::size_t bytes) noexcept;
// Whether large blocks are advised as huge pages (ATTEND_HUGE_PAGES != "0").
bool huge_pages_advised();
// Whether a block of `bytes` is allocated as whole huge pages.
bool huge_block(std::size_t bytes);

}  // namespace attend::detail
