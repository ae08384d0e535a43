// attend-cudnn-descriptor [DEVICE]: cuDNN's device-properties descriptor of a
// real GPU and driver (DeviceProperties built from the device, serialized by
// cuDNN itself), one JSON object per device on stdout. Saved to a file, it is
// a target the cudnn backend checks against without that GPU:
//   attend-cudnn-descriptor 0 > my-gpu.json
//   ATTEND_CUDNN_TARGET=$PWD/my-gpu.json attend select --device cuda ...
// Needs a GPU, its driver and cuDNN 9.8 or later; says which is missing.
#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>

#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cudnn/cudnn_library.h"

namespace {

namespace fe = cudnn_frontend;

int describe(int device) {
  fe::DeviceProperties props;
  props.set_device_id(device);
  fe::error_t e = props.build();
  std::vector<std::uint8_t> json;
  if (e.is_good()) e = props.serialize(json);
  if (e.is_bad()) {
    std::fprintf(stderr, "attend-cudnn-descriptor: device %d: %s\n", device, e.get_message().c_str());
    return 1;
  }
  // cuDNN's buffer may carry its terminating NUL.
  while (!json.empty() && json.back() == 0) json.pop_back();
  std::fwrite(json.data(), 1, json.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const attend::cudnn::Library& lib = attend::cudnn::library();
  if (!lib.ok()) {
    std::fprintf(stderr, "attend-cudnn-descriptor: %s\n", lib.error.c_str());
    return 1;
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::fprintf(stderr, "attend-cudnn-descriptor: no CUDA device (%s)\n",
                 status == cudaSuccess ? "cudaGetDeviceCount: 0" : cudaGetErrorString(status));
    return 1;
  }
  if (argc > 1) {
    const std::string_view arg = argv[1];
    int device = -1;
    const auto r = std::from_chars(arg.data(), arg.data() + arg.size(), device);
    if (r.ec != std::errc() || r.ptr != arg.data() + arg.size() || device < 0 || device >= count) {
      std::fprintf(stderr, "attend-cudnn-descriptor: DEVICE=%s: expected 0..%d\n", argv[1], count - 1);
      return 2;
    }
    return describe(device);
  }
  int failed = 0;
  for (int d = 0; d < count; ++d) failed |= describe(d);
  return failed;
}
