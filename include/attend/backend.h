// The Backend interface: what every attention implementation provides.
//
// A backend is five things: a name, a pure capability check per pass, a workspace
// query, forward and backward. forward()/backward() are non-virtual: they run the
// backend's own check() and validate the tensors before the kernel is entered, so
// a kernel can never run on a problem its check rejects — the selector and the
// kernel share one source of truth.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "attend/spec.h"
#include "attend/tensor.h"

namespace attend {

// Machine-readable category of an unmet requirement.
enum class ReasonCode : std::uint8_t {
  dtype, head_dim_qk, head_dim_v, head_dim_mismatch, layout, varlen, gqa, mask,
  softcap, alibi, bias, bias_grad, dropout, deterministic, no_backward, seqlen,
  memory, other,
};
std::string_view to_string(ReasonCode code);

// One unmet requirement: a code plus a sentence naming the field, the value and
// the limit ("head_dim_v=512 exceeds the backward limit 256").
struct Reason {
  ReasonCode code = ReasonCode::other;
  std::string message;
};

// The answer of Backend::check for one pass: supported, or why not.
struct Support {
  std::vector<Reason> reasons;  // empty <=> supported
  // How a supported pass will run, where the caller should know it (e.g. a half
  // dtype computed at f32 speed, or an upcasting baseline): shown with the
  // verdict, never a reason to decline.
  std::vector<std::string> notes;
  bool ok() const { return reasons.empty(); }
  explicit operator bool() const { return ok(); }
  // Adds a reason when `condition` is false; returns *this for chaining.
  Support& require(bool condition, ReasonCode code, std::string message);
  // Adds a note; returns *this for chaining.
  Support& note(std::string message);
  std::string to_string() const;  // reasons joined with "; " (or "ok")
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
  TensorView out;  // (B,Sq,H,Dv) in spec.layout; thd: (total_q,H,Dv)
  TensorView lse;  // (B,H,Sq) dense or (H,total_q) varlen; f64 when dtype is f64, else f32.
                   // Always required: backward needs it. Natural log; -inf for empty rows.
  Workspace workspace{};
};

struct BackwardArgs {
  const AttentionSpec& spec;
  Inputs in;
  TensorView out;    // forward output
  TensorView lse;    // forward LSE
  TensorView dout;   // gradient of the loss w.r.t. out, out's shape
  TensorView dq;     // written, q's shape
  TensorView dk;     // written, k's shape (summed over the GQA group)
  TensorView dv;     // written, v's shape (summed over the GQA group)
  TensorView dbias;  // written when spec.bias_requires_grad; bias's shape (broadcast dims summed)
  Workspace workspace{};
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  // Pure: the same spec and pass always give the same answer, no side effects.
  virtual Support check(const AttentionSpec& spec, Pass pass) const = 0;
  // Scratch bytes forward/backward need for `spec` (0 if none).
  virtual std::size_t workspace_bytes(const AttentionSpec& spec, Pass pass) const = 0;

  // Validate spec and tensors, require check(spec, pass).ok() and enough
  // workspace (allocating it when none is given), then run.
  // Throws attend::Error(unsupported) carrying the reasons.
  void forward(const ForwardArgs& args) const;
  void backward(const BackwardArgs& args) const;

 protected:
  // Called only after the checks above passed.
  virtual void run_forward(const ForwardArgs& args) const = 0;
  virtual void run_backward(const BackwardArgs& args) const = 0;
};

// Tensor validation used by Backend::forward/backward (exposed for bindings
// that want to fail before allocating). Throws attend::Error naming the tensor.
void validate_inputs(const AttentionSpec& spec, const Inputs& in);
void validate_forward(const ForwardArgs& args);
void validate_backward(const BackwardArgs& args);

}  // namespace attend
