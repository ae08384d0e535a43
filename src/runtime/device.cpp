#include "attend/device.h"

#include <charconv>
#include <new>
#include <string>

#include "attend/error.h"

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

class HostAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device device) override {
    require_host(device);
    return ::operator new (bytes, std::align_val_t{64});
  }
  void deallocate(void* ptr, std::size_t, Device) noexcept override { ::operator delete (ptr, std::align_val_t{64}); }

 private:
  static void require_host(Device device) {
    if (!device.is_host()) {
      throw Error(ErrorCode::invalid_argument, "device", to_string(device),
                  "the host allocator serves cpu memory only; pass an Allocator for this device");
    }
  }
};

}  // namespace

Allocator& host_allocator() {
  static HostAllocator a;
  return a;
}

}  // namespace attend
