// What the backend knows of the GPUs in this process, read once per device,
// and the scope that makes a call's device current.
#pragma once

#include <cstddef>
#include <string>

namespace attend::cuda {

struct DeviceInfo {
  std::string error;  // non-empty: the device cannot be used (why)
  std::string name;
  int major = 0, minor = 0;    // compute capability
  std::size_t smem_optin = 0;  // dynamic shared memory a block may opt into, bytes
  int multiprocessors = 0;
};

// Number of devices (0 when the runtime finds no driver or GPU); the runtime's
// reason in *why when there are none.
int device_count(std::string* why = nullptr);
// Cached properties of device `index` (0 <= index < device_count()).
const DeviceInfo& device_info(int index);

// Makes device `index` current for the scope and restores the caller's.
class DeviceScope {
 public:
  explicit DeviceScope(int index);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace attend::cuda
