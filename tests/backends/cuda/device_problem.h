// Device memory for the GPU backends' tests (cuda, cudnn): a testing::Problem
// uploaded to cuda:0, run through the Backend interface with device
// workspace, and its results copied back for the host baselines.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "support/conformance_cases.h"
#include "support/feature_case.h"
#include "support/tensors.h"

namespace attend {

// Throws rather than ASSERTs, so that it works in helpers returning values;
// gtest reports the exception as a failure of the running test.
inline void cuda_check(cudaError_t status, const char* expr, int line) {
  if (status == cudaSuccess) return;
  throw std::runtime_error("line " + std::to_string(line) + ": " + expr + ": " + cudaGetErrorName(status) + " (" +
                           cudaGetErrorString(status) + ")");
}
#define CUDA_CHECK(expr) cuda_check((expr), #expr, __LINE__)

inline const Target kCuda{Device::cuda(0), -1};

inline std::size_t bytes_of(const TensorView& v) { return static_cast<std::size_t>(v.numel()) * size_of(v.dtype); }

// Device memory of one test, freed together.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : blocks_) (void)cudaFree(p);
  }

  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    // Never 0 bytes: an empty tensor or workspace still gets a valid pointer.
    CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 256)));
    blocks_.push_back(p);
    return p;
  }
  // The host view's shape, strides and dtype over device memory, every byte `fill`.
  TensorView filled(const TensorView& host, int fill) {
    TensorView v = host;
    v.data = allocate(bytes_of(host));
    v.device = Device::cuda(0);
    CUDA_CHECK(cudaMemset(v.data, fill, bytes_of(host)));
    return v;
  }
  // A device copy of a contiguous host tensor (undefined stays undefined).
  TensorView upload(const Tensor& t) {
    if (!t.defined()) return {};
    TensorView v = t.view();
    v.data = allocate(bytes_of(v));
    v.device = Device::cuda(0);
    CUDA_CHECK(cudaMemcpy(v.data, t.data(), bytes_of(v), cudaMemcpyHostToDevice));
    return v;
  }

 private:
  std::vector<void*> blocks_;
};

inline Tensor download(const TensorView& d) {
  TensorView h = d;
  h.device = Device::cpu();
  Tensor t = Tensor::zeros_like(h);
  CUDA_CHECK(cudaMemcpy(t.data(), d.data, bytes_of(d), cudaMemcpyDeviceToHost));
  return t;
}

// A testing::Problem's tensors on the device.
struct DeviceProblem {
  Inputs in;
  TensorView dout;
};

inline DeviceProblem upload(DeviceArena& mem, const testing::Problem& p) {
  DeviceProblem d;
  d.in.q = mem.upload(p.q);
  d.in.k = mem.upload(p.k);
  d.in.v = mem.upload(p.v);
  d.in.bias = mem.upload(p.bias);
  d.in.alibi_slopes = mem.upload(p.slopes);
  d.in.cu_seqlens_q = mem.upload(p.cu_q);
  d.in.cu_seqlens_kv = mem.upload(p.cu_kv);
  d.dout = mem.upload(p.dout);
  return d;
}

// testing::run_backend on the device: forward (and backward) through the
// Backend interface with device workspace, results copied back. Gradients
// start at `grad_init` (accumulate_grads adds to them; NaN: must be overwritten).
// `forward_variant` names the forward's variant (empty: the default, which
// for bf16/f16 is the tensor-core "mma"; backward always resolves to "simt").
inline testing::PassResults run_cuda(const Backend& backend, const testing::Problem& p, bool grads,
                                     double grad_init = 0, Stream stream = {},
                                     const std::string& forward_variant = {}) {
  const AttentionSpec& s = p.spec;
  DeviceArena mem;
  const DeviceProblem d = upload(mem, p);
  const Tensor out_h =
      testing::token_tensor(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_v, s.effective_out_dtype());
  const Tensor lse_h = s.varlen() ? Tensor::zeros(DType::f32, {s.heads_q, s.total_q})
                                  : Tensor::zeros(DType::f32, {s.batch, s.heads_q, s.seqlen_q});
  // All-ones bytes are NaN in every float dtype: an element forward leaves unwritten fails the comparison.
  const TensorView out = mem.filled(out_h, 0xFF);
  const TensorView lse = mem.filled(lse_h, 0xFF);
  // The copies and fills above are on the legacy default stream, which a
  // non-blocking `stream` does not wait for.
  CUDA_CHECK(cudaDeviceSynchronize());
  const Target ft{Device::cuda(0), forward_variant.empty() ? -1 : backend.find_variant(forward_variant)};
  if (!forward_variant.empty()) {
    EXPECT_GE(ft.variant, 0) << forward_variant;
  }
  const std::size_t fws = backend.workspace_bytes(s, Pass::forward, ft);
  backend.forward(ForwardArgs{s, d.in, out, lse, Workspace{mem.allocate(fws), fws}, ft, stream});
  CUDA_CHECK(cudaDeviceSynchronize());
  testing::PassResults r;
  r.out = download(out);
  r.lse = download(lse);
  if (!grads) return r;
  TensorView dq_h = p.q.view();
  dq_h.dtype = s.effective_dq_dtype();
  TensorView dq, dk, dv;
  if (grad_init == 0) {
    dq = mem.filled(dq_h, 0);
    dk = mem.filled(p.k.view(), 0);
    dv = mem.filled(p.v.view(), 0);
  } else {
    const auto init = [&](const TensorView& like) {
      Tensor t = Tensor::zeros_like(like);
      for (std::int64_t i = 0; i < t.numel(); ++i) testing::set_element(t, i, grad_init);
      return mem.upload(t);
    };
    dq = init(dq_h);
    dk = init(p.k.view());
    dv = init(p.v.view());
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::size_t bws = backend.workspace_bytes(s, Pass::backward, kCuda);
  backend.backward(
      BackwardArgs{s, d.in, out, lse, d.dout, dq, dk, dv, {}, Workspace{mem.allocate(bws), bws}, kCuda, stream});
  CUDA_CHECK(cudaDeviceSynchronize());
  r.dq = download(dq);
  r.dk = download(dk);
  r.dv = download(dv);
  return r;
}

inline testing::FeatureCase conformance_case(const std::string& name) {
  for (const testing::FeatureCase& c : testing::conformance_cases()) {
    if (c.name == name) return c;
  }
  throw std::invalid_argument("no conformance case " + name);
}

}  // namespace attend
