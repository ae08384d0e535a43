// The cuda backend: its capability check, workspace and launches. The kernels
// are in forward.cu / backward.cu; this file is plain C++ against the CUDA
// runtime API.
#include "attend/backends/cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attend/error.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_params.h"
#include "kernel/f32_range.h"
#include "kernel/kv_support.h"
#include "runtime/builtin.h"
#include "runtime/checked.h"

namespace attend {
namespace {

using cuda::CudaParams;

// CUDA grids take at most 65535 blocks in y (heads) and z (batch).
constexpr std::int64_t kMaxGridYZ = 65535;
constexpr std::int64_t kMaxGridX = 2147483647;
constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return detail::sat_add_bytes(bytes, kAlign - 1) / kAlign * kAlign; }

// Query rows of all sequences: the workspace's row count.
std::int64_t query_rows(const AttentionSpec& s) {
  return s.varlen() ? s.total_q : detail::sat_mul(s.batch, s.seqlen_q);
}

// Backward's workspace: [D: heads x rows][dQ sum: rows x heads x dqk]; forward needs none.
struct WorkspaceLayout {
  std::size_t delta = 0, dq = 0, total = 0;
};

WorkspaceLayout layout_for(const AttentionSpec& s, Pass pass) {
  WorkspaceLayout w;
  if (pass == Pass::backward) {
    const std::int64_t rows_heads = detail::sat_mul(query_rows(s), s.heads_q);
    w.delta = aligned(detail::sat_float_bytes(rows_heads, 1));
    w.dq = aligned(detail::sat_float_bytes(detail::sat_mul(rows_heads, s.head_dim_qk), 1));
    w.total = detail::sat_add_bytes(w.delta, w.dq);
  }
  return w;
}

// Variants, best first. mma: the bf16/f16 forward on tensor cores; simt: every
// dtype and both passes on CUDA cores. Training takes simt (mma has no
// backward), inference of half dtypes mma.
enum VariantIndex { kMma = 0, kSimt = 1 };

// No variant is marked unavailable: that would ask the CUDA driver at
// registration, in every process that uses attend, GPU or not (initialising
// it before a fork leaves the children without CUDA). The device is looked at
// only when a check sees tensors on it (require_device).
std::vector<Variant> make_variants() {
  return {{"mma", "bf16/f16 forward on tensor cores (mma.sync m16n8k16, f32 accumulators), sm_80 and later", ""},
          {"simt", "FlashAttention-2 tiles on CUDA cores (f32 FMA), both passes, sm_80 and later", ""}};
}

CudaParams make_params(const AttentionSpec& s, const Inputs& in, const TensorView& out, const TensorView& lse) {
  CudaParams p;
  detail::init_kernel_problem(p, s, in);
  p.out = out.data;
  p.so = detail::token_strides(out, s.layout);
  p.lse = lse.as<float>();
  p.slse = detail::lse_strides(lse, s.layout);
  p.varlen = s.varlen();
  p.rows = query_rows(s);
  p.total_q = s.total_q;
  p.total_kv = s.total_kv;
  return p;
}

class CudaBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  bool serves(DeviceKind kind) const override { return kind == DeviceKind::cuda; }
  std::span<const Variant> variants() const override { return variants_; }

 protected:
  void supports(const AttentionSpec& s, Pass pass, const Target& target, Support& sup) const override {
    detail::require_kv_dtype(s, pass, name(), false, sup);
    sup.require(s.dtype == DType::f32 || s.dtype == DType::bf16 || s.dtype == DType::f16, ReasonCode::dtype, [&] {
      return "dtype=" + std::string(to_string(s.dtype)) + " is not computed by cuda (f32, bf16, f16)";
    });
    detail::require_f32_logit_terms(s, name(), sup);
    const std::int64_t limit = pass == Pass::forward ? kCudaMaxHeadDimForward : kCudaMaxHeadDimBackward;
    const char* which = pass == Pass::forward ? "forward" : "backward";
    sup.require(s.head_dim_qk <= limit, ReasonCode::head_dim_qk, [&] {
      return "head_dim_qk=" + std::to_string(s.head_dim_qk) + " exceeds the cuda " + which + " limit " +
             std::to_string(limit);
    });
    sup.require(s.head_dim_v <= limit, ReasonCode::head_dim_v, [&] {
      return "head_dim_v=" + std::to_string(s.head_dim_v) + " exceeds the cuda " + which + " limit " +
             std::to_string(limit);
    });
    sup.require(!s.paged(), ReasonCode::layout, [&] {
      return "kv_page_size=" + std::to_string(s.kv_page_size) + ": paged K/V is not implemented by cuda";
    });
    sup.require(!s.has_sink(), ReasonCode::sinks, [&] {
      return "softmax_type=" + std::string(to_string(s.softmax_type)) + ": attention sinks are not implemented by cuda";
    });
    sup.require(s.effective_out_dtype() == s.dtype, ReasonCode::out_dtype, [&] {
      return "out_dtype=" + std::string(to_string(s.effective_out_dtype())) + ": cuda writes out in the input dtype";
    });
    sup.require(s.batch <= kMaxGridYZ && s.heads_q <= kMaxGridYZ, ReasonCode::other, [&] {
      return "batch=" + std::to_string(s.batch) + ", heads_q=" + std::to_string(s.heads_q) +
             ": cuda launches one grid row per head and batch entry, at most " + std::to_string(kMaxGridYZ);
    });
    // Grid x: 64-row blocks of a sequence; in backward also one thread per dq
    // element and a warp per (row, head). Saturating products: any spec gets an answer.
    const std::int64_t rows_heads = detail::sat_mul(query_rows(s), s.heads_q);
    const std::int64_t threads_x = std::max({detail::sat_mul(std::max(s.seqlen_q, s.seqlen_kv), 4),
                                             pass == Pass::backward ? detail::sat_mul(rows_heads, 32) : 0,
                                             pass == Pass::backward ? detail::sat_mul(rows_heads, s.head_dim_qk) : 0});
    sup.require(threads_x / 256 < kMaxGridX, ReasonCode::seqlen, [&] {
      return "seqlen_q=" + std::to_string(s.seqlen_q) + ", seqlen_kv=" + std::to_string(s.seqlen_kv) +
             ": more blocks than a CUDA grid's x dimension holds (" + std::to_string(kMaxGridX) + ")";
    });
    if (pass == Pass::backward) {
      sup.require(!s.bias_requires_grad, ReasonCode::bias_grad,
                  "bias_requires_grad=true: cuda backward does not compute dbias");
      sup.require(!s.deterministic, ReasonCode::deterministic,
                  "deterministic=true: cuda backward sums dQ with atomics, its last bits vary between runs");
    }
    if (target.variant == kMma) {
      sup.require(s.dtype == DType::bf16 || s.dtype == DType::f16, ReasonCode::dtype, [&] {
        return "dtype=" + std::string(to_string(s.dtype)) +
               ": the mma variant multiplies bf16/f16 on tensor cores (simt computes f32)";
      });
      sup.require(pass == Pass::forward, ReasonCode::no_backward,
                  "the mma variant has no backward yet: training runs the simt variant");
    }
    if (s.varlen())
      sup.note("varlen: cu_seqlens are copied to the host and checked before the kernels (one stream sync)");
    require_device(s, pass, target, sup);
  }

  std::size_t scratch_bytes(const AttentionSpec& s, Pass pass, const Target&) const override {
    return layout_for(s, pass).total;
  }

  void run_forward(const ForwardArgs& a) const override {
    const cuda::DeviceScope scope(a.target.device.index);
    const auto stream = static_cast<cudaStream_t>(a.stream.handle);
    const CudaParams p = make_params(a.spec, a.in, a.out, a.lse);
    cuda::HostIndex index;
    if (p.varlen) cuda::read_index_tensors(a.spec, a.in, stream, index);
    if (a.target.variant == kMma) {
      cuda::launch_forward_mma(p, stream);
    } else {
      cuda::launch_forward(p, stream);
    }
  }

  void run_backward(const BackwardArgs& a) const override {
    const cuda::DeviceScope scope(a.target.device.index);
    const auto stream = static_cast<cudaStream_t>(a.stream.handle);
    CudaParams p = make_params(a.spec, a.in, a.out, a.lse);
    p.dout = a.dout.data;
    p.sdo = detail::token_strides(a.dout, a.spec.layout);
    p.grad_q = a.dq.data;
    p.grad_k = a.dk.data;
    p.grad_v = a.dv.data;
    p.sgq = detail::token_strides(a.dq, a.spec.layout);
    p.sgk = detail::token_strides(a.dk, a.spec.layout);
    p.sgv = detail::token_strides(a.dv, a.spec.layout);
    p.dq_dtype = a.spec.effective_dq_dtype();
    p.accumulate = a.spec.accumulate_grads;
    const WorkspaceLayout w = layout_for(a.spec, Pass::backward);
    auto* base = static_cast<std::byte*>(a.workspace.data);
    p.delta = reinterpret_cast<float*>(base);
    p.dq_acc = reinterpret_cast<float*>(base + w.delta);
    cuda::HostIndex index;
    if (p.varlen) cuda::read_index_tensors(a.spec, a.in, stream, index);
    cuda::launch_backward(p, stream);
  }

 private:
  // The device the tensors are on: present, new enough, and with the shared
  // memory the pass's tiles take.
  static void require_device(const AttentionSpec& s, Pass pass, const Target& target, Support& sup) {
    const int index = target.device.index;
    std::string why;
    const int count = cuda::device_count(&why);
    sup.require(index >= 0 && index < count, ReasonCode::device, [&] {
      return "device=" + to_string(target.device) + ": this process has " + std::to_string(count) + " CUDA device(s)" +
             (why.empty() ? "" : " (" + why + ")");
    });
    if (index < 0 || index >= count) return;
    const cuda::DeviceInfo& info = cuda::device_info(index);
    sup.require(info.error.empty(), ReasonCode::device,
                [&] { return "device=" + to_string(target.device) + ": " + info.error; });
    if (!info.error.empty()) return;
    sup.require(info.major >= 8, ReasonCode::device, [&] {
      return "device=" + to_string(target.device) + " (" + info.name + ") is sm_" + std::to_string(info.major) +
             std::to_string(info.minor) + "; the cuda kernels are built for sm_80 and later";
    });
    // Tile sizes exist only for head dims within the pass's limits (supports' reasons).
    if (sup.failed(ReasonCode::head_dim_qk) || sup.failed(ReasonCode::head_dim_v)) return;
    const std::size_t need = pass == Pass::backward   ? cuda::backward_smem_bytes(s.head_dim_qk, s.head_dim_v)
                             : target.variant == kMma ? cuda::forward_mma_smem_bytes(s.head_dim_qk, s.head_dim_v)
                                                      : cuda::forward_smem_bytes(s.head_dim_qk, s.head_dim_v);
    sup.require(need <= info.smem_optin, ReasonCode::memory, [&] {
      return "head dims " + std::to_string(s.head_dim_qk) + "/" + std::to_string(s.head_dim_v) + ": the " +
             std::string(to_string(pass)) + " tiles take " + std::to_string(need) + " bytes of shared memory, " +
             to_string(target.device) + " (" + info.name + ") allows " + std::to_string(info.smem_optin);
    });
  }

  std::vector<Variant> variants_ = make_variants();
};

}  // namespace

std::shared_ptr<const Backend> make_cuda_backend() { return std::make_shared<CudaBackend>(); }

namespace backends {
// Above every CPU backend: it is the only one serving cuda tensors, and the
// selector never offers it host tensors (its check declines them).
void register_cuda(detail::BuiltinBackends& list) { list.add(make_cuda_backend(), 200); }
}  // namespace backends

}  // namespace attend
