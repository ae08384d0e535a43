#include "backends/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include <deque>
#include <mutex>
#include <new>
#include <string>

#include "attend/backends/cuda.h"
#include "attend/error.h"
#include "backends/cuda/cuda_params.h"

namespace attend {
namespace cuda {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  // Out of memory is the caller's to handle; anything else (a launch failure,
  // an illegal address that poisons the context) leaves the device unusable.
  const ErrorCode code = status == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::bad_state;
  throw Error(code, "cuda", cudaGetErrorName(status), std::string(what) + " failed: " + cudaGetErrorString(status));
}

int device_count(std::string* why) {
  // Asked once: the answer cannot change within a process.
  static const std::pair<int, std::string> count = [] {
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      cudaGetLastError();  // consumed here, so no later launch check reports it
      return std::pair<int, std::string>{0, std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status)};
    }
    return std::pair<int, std::string>{n, n == 0 ? "the CUDA runtime reports no device" : ""};
  }();
  if (why) *why = count.second;
  return count.first;
}

const DeviceInfo& device_info(int index) {
  static std::mutex mutex;
  static std::deque<DeviceInfo> infos;  // deque: references stay valid as it grows
  static std::deque<bool> read;
  const std::lock_guard<std::mutex> lock(mutex);
  if (infos.size() <= static_cast<std::size_t>(index)) {
    infos.resize(static_cast<std::size_t>(index) + 1);
    read.resize(static_cast<std::size_t>(index) + 1, false);
  }
  DeviceInfo& info = infos[static_cast<std::size_t>(index)];
  if (!read[static_cast<std::size_t>(index)]) {
    read[static_cast<std::size_t>(index)] = true;
    cudaDeviceProp prop{};
    const cudaError_t status = cudaGetDeviceProperties(&prop, index);
    if (status != cudaSuccess) {
      info.error = std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(status);
    } else {
      info.name = prop.name;
      info.major = prop.major;
      info.minor = prop.minor;
      info.smem_optin = prop.sharedMemPerBlockOptin;
      info.multiprocessors = prop.multiProcessorCount;
    }
  }
  return info;
}

DeviceScope::DeviceScope(int index) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != index) {
    check(cudaSetDevice(index), "cudaSetDevice");
  } else {
    previous_ = -1;
  }
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

void read_index_tensors(const AttentionSpec& spec, const Inputs& in, cudaStream_t stream, HostIndex& out) {
  // Every view keeps its shape (the paged rules read the pools' page count);
  // the ones validate_contents does not read lose their device pointers.
  out.in = in;
  for (TensorView* v : {&out.in.q, &out.in.k, &out.in.v, &out.in.bias, &out.in.alibi_slopes}) {
    v->data = nullptr;
    v->device = Device::cpu();
  }
  TensorView* copies[HostIndex::kCopies] = {&out.in.cu_seqlens_q,  &out.in.cu_seqlens_kv, &out.in.block_table,
                                            &out.in.cache_seqlens, &out.in.cache_leftpad, &out.in.sinks};
  bool any = false;
  for (int t = 0; t < HostIndex::kCopies; ++t) {
    TensorView& view = *copies[t];
    if (!view.defined() || !view.data) continue;
    // Elements from the first to the last one the view addresses.
    std::int64_t span = 1;
    for (int d = 0; d < view.ndim; ++d) span += (view.shape[d] - 1) * view.strides[d];
    std::vector<std::byte>& buffer = out.buffers[t];
    buffer.resize(static_cast<std::size_t>(span) * size_of(view.dtype));
    check(cudaMemcpyAsync(buffer.data(), view.data, buffer.size(), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(index tensor)");
    view.data = buffer.data();
    view.device = Device::cpu();
    any = true;
  }
  if (!any) return;
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize(index tensors)");
  validate_contents(spec, out.in);
}

namespace {

class CudaAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device device) override {
    if (device.kind != DeviceKind::cuda) {
      throw Error(ErrorCode::invalid_argument, "device", to_string(device),
                  "cuda_allocator() serves cuda devices only");
    }
    const DeviceScope scope(device.index);
    void* p = nullptr;
    // cudaMalloc aligns to 256 bytes, more than the 64 the interface promises.
    const cudaError_t status = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw Error(ErrorCode::out_of_memory, "bytes", std::to_string(bytes),
                  "cudaMalloc on " + to_string(device) + " failed: " + cudaGetErrorString(status));
    }
    return p;
  }
  void deallocate(void* ptr, std::size_t, Device device) noexcept override {
    if (!ptr) return;
    int previous = -1;
    if (cudaGetDevice(&previous) == cudaSuccess && previous != device.index) cudaSetDevice(device.index);
    cudaFree(ptr);
    if (previous >= 0 && previous != device.index) cudaSetDevice(previous);
  }
};

}  // namespace
}  // namespace cuda

Allocator& cuda_allocator() {
  static cuda::CudaAllocator allocator;
  return allocator;
}

int cuda_device_count() { return cuda::device_count(); }

}  // namespace attend
