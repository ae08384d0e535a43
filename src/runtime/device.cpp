#include "attend/device.h"

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <string>

#include "attend/error.h"
#include "runtime/host_memory.h"

namespace attend {

std::string_view to_string(DeviceKind kind) { return kind == DeviceKind::cuda ? "cuda" : "cpu"; }

std::string to_string(Device device) {
  if (device.kind == DeviceKind::cpu) return "cpu";
  return std::string(to_string(device.kind)) + ":" + std::to_string(device.index);
}

Device parse_device(std::string_view text, const char* field) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    const std::string_view n = text.substr(5);
    int index = -1;
    const auto [ptr, ec] = std::from_chars(n.data(), n.data() + n.size(), index);
    if (ec == std::errc() && ptr == n.data() + n.size() && index >= 0) return Device::cuda(index);
  }
  throw Error(ErrorCode::invalid_argument, field, std::string(text), "expected cpu, cuda or cuda:N (N >= 0)");
}

namespace {

// Blocks below this size come from the heap's own free lists, already warm.
constexpr std::size_t kMinCached = std::size_t{1} << 20;
constexpr std::size_t kCacheGranule = std::size_t{1} << 16;  // cached sizes round up to 64 KiB

std::size_t cache_limit_from_env() {
  const char* v = std::getenv("ATTEND_HOST_CACHE_MB");
  if (v == nullptr || *v == '\0') return std::size_t{1024} << 20;
  char* end = nullptr;
  const unsigned long long mb = std::strtoull(v, &end, 10);
  // An unreadable value keeps the default: an allocator cannot report errors
  // from a static initialiser, and the cache only changes speed, not results.
  if (end == v || *end != '\0' || mb > (std::size_t{1} << 24)) return std::size_t{1024} << 20;
  return static_cast<std::size_t>(mb) << 20;
}

class HostAllocator final : public Allocator {
 public:
  HostAllocator() : limit_(cache_limit_from_env()) {}

  void* allocate(std::size_t bytes, Device device) override {
    require_host(device);
    const std::size_t size = block_size(bytes);
    if (size == 0) return detail::host_allocate(bytes);
    {
      const std::lock_guard lock(mu_);
      const auto it = free_.find(size);
      if (it != free_.end()) {
        void* p = it->second->ptr;
        lru_.erase(it->second);
        free_.erase(it);
        cached_ -= size;
        return p;
      }
    }
    return detail::host_allocate(size);
  }

  void deallocate(void* ptr, std::size_t bytes, Device) noexcept override {
    const std::size_t size = block_size(bytes);
    if (size == 0 || size > limit_) {
      detail::host_free(ptr, size == 0 ? bytes : size);
      return;
    }
    std::list<Block> evicted;
    try {
      const std::lock_guard lock(mu_);
      // The oldest cached blocks make room: a workload that changed shapes
      // should not pin the memory of the old ones.
      while (cached_ + size > limit_ && !lru_.empty()) {
        free_.erase(lru_.front().where);
        cached_ -= lru_.front().size;
        evicted.splice(evicted.end(), lru_, lru_.begin());
      }
      lru_.push_back({ptr, size, {}});
      lru_.back().where = free_.emplace(size, std::prev(lru_.end()));
      cached_ += size;
    } catch (const std::bad_alloc&) {  // no room for the bookkeeping: free it instead
      detail::host_free(ptr, size);
    }
    for (const Block& b : evicted) detail::host_free(b.ptr, b.size);
  }

  std::size_t cached() {
    const std::lock_guard lock(mu_);
    return cached_;
  }

  void release() {
    std::list<Block> all;
    {
      const std::lock_guard lock(mu_);
      all.swap(lru_);
      free_.clear();
      cached_ = 0;
    }
    for (const Block& b : all) detail::host_free(b.ptr, b.size);
  }

 private:
  struct Block;
  using Index = std::multimap<std::size_t, std::list<Block>::iterator>;
  struct Block {
    void* ptr;
    std::size_t size;
    Index::iterator where;
  };

  // The cached size class of a request; 0 when it is not cached.
  std::size_t block_size(std::size_t bytes) const {
    if (limit_ == 0 || bytes < kMinCached || bytes > SIZE_MAX - detail::kHugePageBytes) return 0;
    // A block of huge pages occupies whole ones (host_memory.h): its class is
    // their size, so that the cache counts the memory it holds.
    const std::size_t granule = detail::huge_block(bytes) ? detail::kHugePageBytes : kCacheGranule;
    return (bytes + granule - 1) / granule * granule;
  }

  static void require_host(Device device) {
    if (!device.is_host()) {
      throw Error(ErrorCode::invalid_argument, "device", to_string(device),
                  "the host allocator serves cpu memory only; pass an Allocator for this device");
    }
  }

  const std::size_t limit_;
  std::mutex mu_;
  std::list<Block> lru_;  // oldest first
  Index free_;            // by size, into lru_
  std::size_t cached_ = 0;
};

// Never destroyed: tensors with static storage may be freed after every
// other static, and the cached blocks go back to the system with the process.
HostAllocator& host() {
  static HostAllocator* a = new HostAllocator;
  return *a;
}

}  // namespace

Allocator& host_allocator() { return host(); }

std::size_t host_cache_bytes() { return host().cached(); }

void host_cache_release() { host().release(); }

}  // namespace attend
