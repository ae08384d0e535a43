// The Backend interface: what every attention implementation provides.
//
// A backend is five things: a name, a pure capability check per pass, a workspace
// query, forward and backward. forward()/backward() are non-virtual: they run the
// backend's own check() and validate the tensors before the kernel is entered, so
// a kernel can never run on a problem its check rejects — the selector and the
// kernel share one source of truth.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "attend/device.h"
#include "attend/spec.h"
#include "attend/tensor.h"

namespace attend {

// Machine-readable category of an unmet requirement.
enum class ReasonCode : std::uint8_t {
  dtype,
  head_dim_qk,
  head_dim_v,
  head_dim_mismatch,
  layout,
  varlen,
  gqa,
  mask,
  softcap,
  alibi,
  bias,
  bias_grad,
  dropout,
  deterministic,
  no_backward,
  seqlen,
  memory,
  other,
  device,      // the tensors' device is not one the backend serves
  variant,     // the variant is unknown, unavailable here, or excluded by policy
  positions,   // q_offset / kv_offset (global positions of a partial problem)
  out_dtype,   // an output dtype other than the input dtype (f32 partials)
  accumulate,  // backward adding into dq/dk/dv instead of overwriting them
  sinks,       // softmax_type: a sink logit, or the gradient of learnable ones
  library,     // an external library the backend runs on is missing, too old, or refuses the problem
  kv_dtype,    // an 8-bit K/V (quantized cache) the backend or pass does not read
};
inline constexpr int kReasonCodeCount = static_cast<int>(ReasonCode::kv_dtype) + 1;
std::string_view to_string(ReasonCode code);

// One unmet requirement: a code plus a sentence naming the field, the value and
// the limit ("head_dim_v=512 exceeds the backward limit 256").
struct Reason {
  ReasonCode code = ReasonCode::other;
  std::string message;
};

// The answer of Backend::check for one pass: supported, or why not.
//
// Text is built only when someone will read it. require() and note() take the
// message as a string or as a callable returning one; a callable runs only for
// an unmet requirement (or a note) of a Support in Detail::full. Detail::codes
// records which codes failed and builds no text, so a passing check allocates
// nothing and a cached selection can re-check a problem cheaply.
class Support {
 public:
  enum class Detail : std::uint8_t { codes, full };

  Support() = default;
  explicit Support(Detail detail) : detail_(detail) {}

  std::vector<Reason> reasons;  // Detail::full: one per unmet requirement
  // How a supported pass will run, where the caller should know it (e.g. a half
  // dtype computed at f32 speed, or an upcasting baseline): shown with the
  // verdict, never a reason to decline. Detail::full only.
  std::vector<std::string> notes;
  // A pass judged for another device than this process has: the cudnn
  // backend's target where there is no GPU (`attend select --target h100`).
  // The pass still cannot run here (ok() is false, a [device] reason says
  // why); this is the answer for that device, which the verdict table shows
  // in the pass's column. Detail::full only.
  struct Elsewhere {
    std::string device;      // what was judged: "H100 SXM descriptor", "sm_90"
    bool ok = false;         // the pass would run there
    std::string decided_by;  // the layer with the last word: "cuDNN's rules for sm_90 and cuDNN 9.19.0"
    std::string verdict;     // that layer's words: the refusal, or what accepted
  };
  std::optional<Elsewhere> elsewhere;

  bool ok() const { return failed_ == 0; }
  explicit operator bool() const { return ok(); }
  bool failed(ReasonCode code) const { return (failed_ >> static_cast<int>(code)) & 1u; }
  std::uint32_t failed_codes() const { return failed_; }
  Detail detail() const { return detail_; }

  // Records a reason when `condition` is false; returns *this for chaining.
  template <class Message>
  Support& require(bool condition, ReasonCode code, Message&& message) {
    if (condition) return *this;
    failed_ |= 1u << static_cast<int>(code);
    if (detail_ == Detail::full) reasons.push_back({code, text(std::forward<Message>(message))});
    return *this;
  }
  template <class Message>
  Support& note(Message&& message) {
    if (detail_ == Detail::full) notes.push_back(text(std::forward<Message>(message)));
    return *this;
  }
  std::string to_string() const;  // reasons joined with "; " (or "ok")

 private:
  template <class Message>
  static std::string text(Message&& m) {
    if constexpr (std::is_invocable_v<Message>)
      return std::string(m());
    else
      return std::string(std::forward<Message>(m));
  }
  std::uint32_t failed_ = 0;
  Detail detail_ = Detail::full;
};
static_assert(kReasonCodeCount <= 32, "Support keeps failed codes in a 32-bit mask");

// One implementation a backend can run a problem with: for CPU backends a
// kernel family (instruction set), later tile configurations or GPU
// architectures. The selector judges every (backend, variant) pair.
struct Variant {
  std::string name;         // stable identifier, e.g. "avx512" ("default" for a backend with one)
  std::string summary;      // one line for explanations, e.g. "AVX-512 kernels; bf16 GEMMs on vdpbf16ps"
  std::string unavailable;  // non-empty: why this process cannot run it ("this CPU lacks AVX-512")
  // CPU kernel families: their instruction-set level (0 scalar, 1 avx2, 2 avx512,
  // 3 avx512bf16, 4 avx512amx), which the ATTEND_ISA policy caps; -1: not an ISA family.
  int isa_level = -1;
  // Never picked on its own (an emulation, a debugging aid): it runs only where
  // the ATTEND_ISA policy names it (it is then its backend's only variant),
  // where a force names it (name:variant), or as an explicit Target::variant.
  bool on_request = false;
};

// Where and how a backend runs a problem: the tensors' device and one of its
// variants (an index into Backend::variants(); -1: the first variant, in the
// backend's order and within the current policy, whose check accepts the pass;
// when none does, the last such variant, whose reasons the check then gives).
struct Target {
  Device device{};
  int variant = -1;
};

// The tensors of a problem. Shapes follow spec.layout (see tensor.h).
struct Inputs {
  TensorView q;             // (B,Sq,H,Dqk) in the spec's layout; thd: (total_q,H,Dqk)
  TensorView k;             // (B,Sk,Hkv,Dqk);                    thd: (total_kv,Hkv,Dqk)
  TensorView v;             // (B,Sk,Hkv,Dv);                     thd: (total_kv,Hkv,Dv)
  TensorView bias;          // spec.has_bias: (1|B, 1|H, Sq, Sk), spec.dtype
  TensorView alibi_slopes;  // spec.alibi: (H) or (B,H), f32
  TensorView cu_seqlens_q;  // varlen: (B+1) i32, cu[0]=0, non-decreasing, cu[B] <= total_q
  TensorView cu_seqlens_kv; // varlen: (B+1) i32, likewise against total_kv
  // Paged K/V (spec.kv_page_size > 0); k and v are then (pages, page_size, Hkv, D) pools.
  // (Braced defaults keep older aggregate initialisations of Inputs warning-free.)
  TensorView block_table{}; // (B, max_pages) i32: page ids of each sequence, in token order
  TensorView cache_seqlens{}; // (B) i32: sequence b's keys end at token cache_seqlens[b]
  TensorView cache_leftpad{}; // spec.kv_leftpad: (B) i32, its keys start at token cache_leftpad[b]
  // softmax_type = learnable: (H) sink logits, f32 (f64 for f64 problems),
  // finite, entering each row's softmax as given (not scaled or softcapped).
  TensorView sinks{};
  // spec.kv_scale != none (an 8-bit kv_dtype): the f32 scales of K and V, shaped
  // as expected_shape(spec, Role::k_scale) says; finite and > 0 wherever a
  // sequence's keys are read. K's element is code * k_scale[...], V's code * v_scale[...].
  TensorView k_scale{};
  TensorView v_scale{};
};

// Caller-provided scratch memory, at least Backend::workspace_bytes. Optional:
// with data == nullptr, forward/backward allocate their own for the call.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

struct ForwardArgs {
  const AttentionSpec& spec;
  Inputs in;
  TensorView out;  // (B,Sq,H,Dv) in spec.layout; thd: (total_q,H,Dv); dtype spec.effective_out_dtype()
  TensorView lse;  // (B,H,Sq) dense or (H,total_q) varlen; f64 when dtype is f64, else f32.
                   // Always required: backward needs it. Natural log; -inf for empty rows.
  Workspace workspace{};
  Target target{};  // device of the tensors and the variant to run (-1: the default)
  Stream stream{};  // passed through to device backends
};

struct BackwardArgs {
  const AttentionSpec& spec;
  Inputs in;
  TensorView out;    // forward output
  TensorView lse;    // forward LSE
  TensorView dout;   // gradient of the loss w.r.t. out, out's shape
  TensorView dq;     // q's shape; written (spec.accumulate_grads: added to)
  TensorView dk;     // k's shape (summed over the GQA group); written or added to
  TensorView dv;     // v's shape (summed over the GQA group); written or added to
  TensorView dbias;  // written when spec.bias_requires_grad; bias's shape (broadcast dims summed)
  Workspace workspace{};
  Target target{};
  Stream stream{};
  // softmax_type = learnable: (H), the sinks' dtype; dL/dz_h summed over batch
  // and query rows. Written, or added to with spec.accumulate_grads.
  TensorView dsinks{};
};

struct PlanAccess;

// A backend: a name, the devices and variants it serves, a pure capability
// check per pass, a workspace query, forward and backward.
//
// The public entry points are non-virtual. check() applies the conditions every
// backend shares (device served, variant known and available) and then asks the
// backend's supports(); forward()/backward() validate the tensors, run that same
// check and size the workspace before entering run_forward/run_backward. So a
// kernel cannot run on a problem its check rejects, whoever calls it.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  // Whether the kernels take memory of this device kind. Default: cpu only.
  virtual bool serves(DeviceKind kind) const { return kind == DeviceKind::cpu; }
  // The implementations this backend can run, best first. Default: one, "default".
  // The span stays valid for the backend's lifetime.
  virtual std::span<const Variant> variants() const;

  // Pure: the same (spec, pass, target) always gives the same answer. With
  // target.variant = -1 and no variant this process can run (all marked
  // unavailable), it declines with ReasonCode::variant rather than throwing.
  Support check(const AttentionSpec& spec, Pass pass, const Target& target = {},
                Support::Detail detail = Support::Detail::full) const;
  // Scratch bytes forward/backward need (0 if none). Throws attend::Error for
  // an unknown variant.
  std::size_t workspace_bytes(const AttentionSpec& spec, Pass pass, const Target& target = {}) const;

  // Validate spec and tensors, require check(spec, pass, target).ok() and enough
  // workspace (allocating it when none is given), then run.
  // Throws attend::Error(unsupported) carrying the reasons.
  void forward(const ForwardArgs& args) const;
  void backward(const BackwardArgs& args) const;

  // The first available variant (in the backend's order) within the current
  // policy's ATTEND_ISA level: what Target::variant = -1 means where every
  // variant computes the same (see Target). Throws attend::Error when none is,
  // e.g. ATTEND_ISA names an ISA this CPU lacks.
  int default_variant() const;
  // Index of the variant called `name`, or -1.
  int find_variant(std::string_view name) const;

  // A speed preference, not a limit: true when this backend expects to be
  // slower than the backends registered below it on `spec` (decode above its
  // measured seqlen_q crossover with flash). The priority strategy then ranks
  // it after every viable backend that does not defer (it still runs when none
  // other can); autotune ignores it and measures. Pure and allocation-free
  // when `why` is null; otherwise sets *why to one sentence naming the field,
  // its value and the crossover. Default: never defers.
  virtual bool defers(const AttentionSpec& spec, Mode mode, const Target& target, std::string* why = nullptr) const;

 protected:
  // The backend's own conditions for a validated spec on a device it serves and
  // an available variant (target.variant is resolved, >= 0). Adds a reason per
  // unmet condition to `support` (and notes on how a supported pass runs).
  virtual void supports(const AttentionSpec& spec, Pass pass, const Target& target, Support& support) const = 0;
  // Scratch bytes for the resolved target.
  virtual std::size_t scratch_bytes(const AttentionSpec& spec, Pass pass, const Target& target) const = 0;
  // Called only after the checks above passed; args.target.variant is resolved.
  virtual void run_forward(const ForwardArgs& args) const = 0;
  virtual void run_backward(const BackwardArgs& args) const = 0;

 private:
  friend struct PlanAccess;
  Target resolve(const AttentionSpec& spec, Pass pass, const Target& target) const;
};

// Tensor validation used by Backend::forward/backward and plans (exposed for
// bindings that want to fail before allocating). Throws attend::Error naming the
// tensor. Two passes: validate_*_shapes checks dtypes, shapes, strides, devices
// and pointers without dereferencing any tensor; validate_contents reads the
// host tensors that locate data (cu_seqlens, block tables, cache lengths) and
// checks every index a kernel will follow. Contents on a device are the
// backend's to validate (its check notes it). validate_inputs runs both.
void validate_input_shapes(const AttentionSpec& spec, const Inputs& in);
void validate_contents(const AttentionSpec& spec, const Inputs& in);
void validate_inputs(const AttentionSpec& spec, const Inputs& in);
void validate_forward(const ForwardArgs& args);
void validate_backward(const BackwardArgs& args);

}  // namespace attend
