// What the backend knows of the GPUs in this process, read once per device,
// and the scope that makes a call's device current.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attend/backend.h"

namespace attend::cuda {

struct DeviceInfo {
  std::string error;  // non-empty: the device cannot be used (why)
  std::string name;
  int major = 0, minor = 0;    // compute capability
  int sm() const { return major * 10 + minor; }  // e.g. 90 for sm_90
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

// Host copies of what a device call's validation reads (varlen's cu_seqlens;
// paged K/V's block table, cache lengths and left padding; learnable sink
// logits), which live on the device where the runtime never reads. Each is
// copied over its span (any strides), then the runtime's own rules
// (validate_contents) check the copies, so kernels follow only checked
// indices and a bad entry gets the same attend::Error as on the host. One
// stream synchronisation, none when there is nothing to read.
struct HostIndex {
  static constexpr int kCopies = 6;
  Inputs in;  // the call's views; index tensors and sinks point into `buffers`, the rest hold no data
  std::vector<std::byte> buffers[kCopies];
};
void read_index_tensors(const AttentionSpec& spec, const Inputs& in, cudaStream_t stream, HostIndex& out);

}  // namespace attend::cuda
