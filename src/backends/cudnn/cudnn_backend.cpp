// The cudnn backend: cuDNN's fused SDPA behind attend's per-pass check. The
// check has two layers: the rules (cudnn_rules.h, cuDNN's documented support,
// no GPU needed) and, on a device with cuDNN loaded, the engine (cudnn_engine.h,
// cuDNN's own verdict on the graph the pass needs). A training job is offered
// cudnn only when cuDNN has accepted its backward graph too.
#include "attend/backends/cudnn.h"

#include <cudnn_version.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "attend/error.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cudnn/cudnn_deviceless.h"
#include "backends/cudnn/cudnn_engine.h"
#include "backends/cudnn/cudnn_library.h"
#include "backends/cudnn/cudnn_rules.h"
#include "backends/cudnn/cudnn_targets.h"
#include "runtime/builtin.h"

namespace attend {
namespace {

constexpr int kHeaderVersion = CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL;

// The target the check assumes where the process has no such device:
// set_cudnn_target's, else $ATTEND_CUDNN_TARGET's, else sm_90 (H100/H200, the
// GPUs this project is lent) with the cuDNN release whose headers the build
// used, rules only. The variable is read at each check and parsed again when
// it changed (`attend select --target` and Python's explain(target=...) set
// it in the running process) or when the descriptor file it names did.
struct TargetSlot {
  std::mutex mutex;
  bool set_explicitly = false;
  std::string text, field;  // what `parsed` came from
  std::shared_ptr<const cudnn::AssumedTarget> parsed;
};
TargetSlot& target_slot() {
  static TargetSlot slot;
  return slot;
}

std::shared_ptr<const cudnn::AssumedTarget> parse_target(const std::string& text, std::string_view field) {
  cudnn::AssumedTarget t;
  t.rules = {90, kHeaderVersion};
  if (!text.empty()) t = cudnn::parse_assumed_target(text, field, kHeaderVersion);
  return std::make_shared<const cudnn::AssumedTarget>(std::move(t));
}

std::shared_ptr<const cudnn::AssumedTarget> assumed_target() {
  TargetSlot& slot = target_slot();
  const std::lock_guard<std::mutex> lock(slot.mutex);
  if (!slot.set_explicitly) {
    const char* env = std::getenv("ATTEND_CUDNN_TARGET");
    const std::string text = env ? env : "";
    if (slot.parsed && text == slot.text && !slot.parsed->stale()) return slot.parsed;
    slot.parsed = parse_target(text, "ATTEND_CUDNN_TARGET");
    slot.text = text;
    slot.field = "ATTEND_CUDNN_TARGET";
  } else if (slot.parsed->stale()) {
    slot.parsed = parse_target(slot.text, slot.field);
  }
  return slot.parsed;
}

// Copies `from`'s failures (and, in full detail, its reasons and notes).
void merge(Support& into, const Support& from) {
  for (const Reason& r : from.reasons) into.require(false, r.code, r.message);
  for (int c = 0; c < kReasonCodeCount; ++c)
    if (from.failed(static_cast<ReasonCode>(c)) && !into.failed(static_cast<ReasonCode>(c)))
      into.require(false, static_cast<ReasonCode>(c), "");
  for (const std::string& n : from.notes) into.note(n);
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
    const std::shared_ptr<const cudnn::AssumedTarget> assumed = assumed_target();
    const bool real_sm = info && info->error.empty();
    // The rules: for the device and the loaded cuDNN where there are both,
    // else for the assumed target (its release where it names one).
    cudnn::RuleTarget rt = assumed->rules;
    if (real_sm) rt.sm = info->sm();
    if (lib.ok() && (real_sm || !assumed->version_given)) rt.version = lib.version;
    if (!present) {
      deviceless(s, pass, *assumed, rt, count, why, target, sup);
      return;
    }
    if (info) {
      sup.require(info->error.empty(), ReasonCode::device,
                  [&] { return "device=" + to_string(target.device) + ": " + info->error; });
    }
    sup.require(lib.ok(), ReasonCode::library, [&] { return "cuDNN is not loaded: " + lib.error; });
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

 private:
  // No such device: declined for that ([device]), with what cuDNN would say
  // for the assumed target. The rules run always; cuDNN's own check runs for a
  // named descriptor, and only where the reasons are shown (Detail::full: the
  // verdict here is no either way, and a graph costs ~0.1 s). A target named
  // by the user gets its own verdict (Support::elsewhere): the table's column
  // answers "would this run on that GPU", the [device] reason says why not here.
  static void deviceless(const AttentionSpec& s, Pass pass, const cudnn::AssumedTarget& assumed,
                         const cudnn::RuleTarget& rt, int count, const std::string& why, const Target& target,
                         Support& sup) {
    const cudnn::Library& lib = cudnn::library();
    Support rules(sup.detail());
    cudnn::check_rules(s, pass, rt, rules);
    const bool same_release = lib.ok() && rt.version == lib.version;
    const bool full = sup.detail() == Support::Detail::full;
    // Why cuDNN's own check cannot be asked ("" where it can).
    std::string unasked;
    if (!assumed.deviceless())
      unasked = "the target names no GPU (h100, or a descriptor file, would add it)";
    else if (!lib.ok())
      unasked = "cuDNN is not loaded";
    else if (!same_release)
      unasked = "the target names cuDNN " + cudnn::version_string(rt.version) + ", the loaded library is " +
                cudnn::version_string(lib.version);
    else if (full && !cudnn::deviceless_libcuda_error().empty())
      unasked = "no libcuda to load";
    const bool ask = full && rules.ok() && unasked.empty();
    const std::string engine = ask ? cudnn::deviceless_check(s, pass, assumed, lib.version) : "";  // "" accepted
    const std::string here = "device=" + to_string(target.device) + ": this process has " + std::to_string(count) +
                             " CUDA device(s)" + (why.empty() ? "" : " (" + why + ")");
    if (!assumed.given) {
      sup.require(false, ReasonCode::device, [&] {
        return here + "; the other reasons are cuDNN's rules for sm_" + std::to_string(rt.sm) + " and cuDNN " +
               cudnn::version_string(rt.version) +
               " (ATTEND_CUDNN_TARGET or --target: sm_XY[,9.A.B], or a GPU such as h100 for cuDNN's own verdict)";
      });
    } else {
      sup.require(false, ReasonCode::device, [&] { return here + ": nothing runs here"; });
      if (full) {
        Support::Elsewhere& e = sup.elsewhere.emplace();
        e.device = assumed.deviceless() ? assumed.label : "sm_" + std::to_string(rt.sm);
        e.ok = rules.ok() && engine.empty();
        const std::string by_rules =
            "cuDNN's rules for sm_" + std::to_string(rt.sm) + " and cuDNN " + cudnn::version_string(rt.version);
        if (!rules.ok()) {
          e.decided_by = by_rules;
          e.verdict = rules.to_string();
        } else if (ask) {
          e.decided_by = cudnn::deviceless_label(assumed, lib.version);
          e.verdict = !engine.empty() ? engine
                                      : "accepted the " + std::string(to_string(pass)) +
                                            " graph (check_support passed for the descriptor; no plan was built "
                                            "or run)";
        } else {
          e.decided_by = by_rules;
          e.verdict = "the rules accept; cuDNN's own check not asked: " + unasked;
        }
      }
    }
    sup.require(lib.ok(), ReasonCode::library, [&] { return "cuDNN is not loaded: " + lib.error; });
    merge(sup, rules);
    sup.require(engine.empty(), ReasonCode::library, [&] { return engine; });
    if (full && rules.ok() && assumed.deviceless() && same_release && !cudnn::deviceless_libcuda_error().empty()) {
      sup.require(false, ReasonCode::library, [&] {
        return cudnn::deviceless_label(assumed, lib.version) + ": " + cudnn::deviceless_libcuda_error();
      });
    }
  }

 protected:
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

void set_cudnn_target(std::string_view text, std::string_view field) {
  auto parsed = std::make_shared<const cudnn::AssumedTarget>(cudnn::parse_assumed_target(text, field, kHeaderVersion));
  TargetSlot& slot = target_slot();
  const std::lock_guard<std::mutex> lock(slot.mutex);
  slot.parsed = std::move(parsed);
  slot.text = text;
  slot.field = field;
  slot.set_explicitly = true;
}

namespace backends {
// Above cuda (200): where cuDNN accepts a pass it is the vendor's tensor-core
// engine, many times faster than cuda's kernels; where it declines, cuda:mma
// and cuda:simt run as before.
void register_cudnn(detail::BuiltinBackends& list) { list.add(make_cudnn_backend(), 250); }
}  // namespace backends

}  // namespace attend
