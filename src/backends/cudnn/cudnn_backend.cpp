// The cudnn backend: cuDNN's fused SDPA behind attend's per-pass check. The
// check has two layers: the rules (cudnn_rules.h, cuDNN's documented support,
// no GPU needed) and, on a device with cuDNN loaded, the engine (cudnn_engine.h,
// cuDNN's own verdict on the graph the pass needs). A training job is offered
// cudnn only when cuDNN has accepted its backward graph too.
#include "attend/backends/cudnn.h"

#include <cudnn_version.h>

#include <cstdlib>
#include <string>

#include "attend/error.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cudnn/cudnn_engine.h"
#include "backends/cudnn/cudnn_library.h"
#include "backends/cudnn/cudnn_rules.h"
#include "runtime/builtin.h"

namespace attend {
namespace {

constexpr int kHeaderVersion = CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL;

// The target the rules assume where the process has no such device:
// $ATTEND_CUDNN_TARGET, else sm_90 (H100/H200, the GPUs this project is lent)
// with the cuDNN release whose headers the build used. Read once.
const cudnn::RuleTarget& assumed_target() {
  static const cudnn::RuleTarget t = [] {
    const char* env = std::getenv("ATTEND_CUDNN_TARGET");
    if (env && *env) return cudnn::parse_rule_target(env, "ATTEND_CUDNN_TARGET", kHeaderVersion);
    return cudnn::RuleTarget{90, kHeaderVersion};
  }();
  return t;
}

class CudnnBackend final : public Backend {
 public:
  std::string_view name() const override { return "cudnn"; }
  bool serves(DeviceKind kind) const override { return kind == DeviceKind::cuda; }

 protected:
  void supports(const AttentionSpec& s, Pass pass, const Target& target, Support& sup) const override {
    const int index = target.device.index;
    std::string why;
    const int count = cuda::device_count(&why);
    const bool present = index >= 0 && index < count;
    const cuda::DeviceInfo* info = present ? &cuda::device_info(index) : nullptr;
    const cudnn::Library& lib = cudnn::library();
    // The rules below still run, for the assumed target the reason names, so
    // a machine without a GPU shows what cuDNN would say about the problem.
    sup.require(present, ReasonCode::device, [&] {
      const cudnn::RuleTarget& t = assumed_target();
      return "device=" + to_string(target.device) + ": this process has " + std::to_string(count) + " CUDA device(s)" +
             (why.empty() ? "" : " (" + why + ")") + "; the other reasons are cuDNN's rules for sm_" +
             std::to_string(t.sm) + " (ATTEND_CUDNN_TARGET=sm_XY[,9.A.B] sets it)";
    });
    if (info) {
      sup.require(info->error.empty(), ReasonCode::device,
                  [&] { return "device=" + to_string(target.device) + ": " + info->error; });
    }
    sup.require(lib.ok(), ReasonCode::library, [&] { return "cuDNN is not loaded: " + lib.error; });
    // The rules: for the device and the loaded cuDNN where there are both,
    // else for the assumed target (the note says which).
    cudnn::RuleTarget rt = assumed_target();
    const bool real_sm = info && info->error.empty();
    if (real_sm) rt.sm = info->sm();
    if (lib.ok()) rt.version = lib.version;
    sup.note([&] {
      return "rules evaluated for sm_" + std::to_string(rt.sm) + (real_sm ? " (the device)" : " (assumed)") +
             " and cuDNN " + cudnn::version_string(rt.version) + (lib.ok() ? " (loaded)" : " (assumed)");
    });
    cudnn::check_rules(s, pass, rt, sup);
    if (!sup.ok() || !real_sm || !lib.ok()) return;
    // The engine: cuDNN's verdict on this pass's graph (built once per key).
    const std::string refused = cudnn::engine_check(s, pass, index, rt.sm);
    sup.require(refused.empty(), ReasonCode::library, [&] { return refused; });
    if (s.varlen() || s.paged() || s.softmax_type == SoftmaxType::learnable)
      sup.note(
          "cu_seqlens, block tables, cache lengths and sink logits are read back from the device and checked "
          "by the runtime's rules before cuDNN runs (one stream sync per call)");
  }

  std::size_t scratch_bytes(const AttentionSpec& s, Pass pass, const Target& target) const override {
    const cuda::DeviceInfo& info = cuda::device_info(target.device.index);
    return cudnn::engine_workspace(s, pass, target.device.index, info.sm());
  }

  void run_forward(const ForwardArgs& a) const override {
    const cuda::DeviceInfo& info = cuda::device_info(a.target.device.index);
    cudnn::engine_forward(a, info.sm());
  }

  void run_backward(const BackwardArgs& a) const override {
    const cuda::DeviceInfo& info = cuda::device_info(a.target.device.index);
    cudnn::engine_backward(a, info.sm());
  }
};

}  // namespace

std::shared_ptr<const Backend> make_cudnn_backend() { return std::make_shared<CudnnBackend>(); }

namespace backends {
// Above cuda (200): where cuDNN accepts a pass it is the vendor's tensor-core
// engine, many times faster than cuda's kernels; where it declines, cuda:mma
// and cuda:simt run as before.
void register_cudnn(detail::BuiltinBackends& list) { list.add(make_cudnn_backend(), 250); }
}  // namespace backends

}  // namespace attend
