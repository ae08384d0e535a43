// Where tensors live and how work is ordered on them: the device, an opaque
// stream handle, and an allocator hook for the memory the runtime allocates
// (outputs, workspace). Nothing here needs a GPU toolkit: a CUDA backend takes
// the stream handle as a cudaStream_t and an allocator that calls cudaMalloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attend {

// The kind of memory a pointer refers to. cpu: host memory the runtime may read
// (it validates cu_seqlens, block tables and cache lengths itself); cuda: device
// memory it never dereferences (a backend serving cuda validates contents in its
// kernels, and its check says so).
enum class DeviceKind : std::uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // ordinal among devices of that kind; 0 for the host

  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  bool is_host() const { return kind == DeviceKind::cpu; }
  friend constexpr bool operator==(Device a, Device b) { return a.kind == b.kind && a.index == b.index; }
};

std::string_view to_string(DeviceKind kind);
std::string to_string(Device device);  // "cpu", "cuda:1"
// "cpu", "cuda", "cuda:N"; throws attend::Error naming `field` otherwise.
Device parse_device(std::string_view text, const char* field = "device");

// An opaque queue handle passed through to the backend: cudaStream_t for cuda
// (nullptr: the default stream); ignored by CPU backends, which finish before
// returning.
struct Stream {
  void* handle = nullptr;
};

// Memory the runtime allocates on the caller's behalf (outputs of the
// high-level forward/backward, workspace when none is given). allocate returns
// at least `bytes` bytes aligned to 64 on `device`, or throws (std::bad_alloc
// or attend::Error); deallocate receives the same pointer, size and device.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes, Device device) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, Device device) noexcept = 0;
};

// The host allocator used when none is given: 64-byte aligned operator new.
// It serves Device::cpu() only (other devices: attend::Error). Blocks of
// 2 MiB and more are 2 MiB-aligned and advised as transparent huge pages on
// Linux (the kernels read rows H*D elements apart, a TLB miss per row with
// 4 KiB pages), as is the storage of Tensor::zeros; ATTEND_HUGE_PAGES=0 (read
// once) keeps 4 KiB pages. Blocks of 1 MiB and more are kept when freed, up
// to a bound, and handed out again for the same rounded size (64 KiB classes;
// whole 2 MiB pages for huge-page blocks): repeated calls then reuse memory
// whose pages are already mapped, instead of page-faulting fresh ones (glibc
// maps blocks of 32 MiB and more anew on every allocation). The bound is
// ATTEND_HOST_CACHE_MB (MiB, read once; default 1024; 0 disables the cache).
Allocator& host_allocator();

// What the host allocator holds in freed, cached blocks, in bytes.
std::size_t host_cache_bytes();
// Returns the host allocator's cached blocks to the system (like
// torch.cuda.empty_cache); memory in use is not affected.
void host_cache_release();

}  // namespace attend
