// Test backends whose capabilities differ by pass. They compute through the
// reference backend (the point is selection, not math) and count every call so
// tests can prove which kernel ran and that a rejected kernel never did.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "attend/attend.h"
#include "attend/backends/reference.h"

namespace attend::testing {

struct CallCounts {
  std::atomic<int> checks{0}, forwards{0}, backwards{0};
};

// The FlashAttention-3 pattern: forward accepts head_dim_qk != head_dim_v
// (qk <= 256, v <= 512), backward only square head dims up to 256.
class ForwardOnlyMismatchBackend final : public Backend {
 public:
  explicit ForwardOnlyMismatchBackend(std::string name = "fa3_like") : name_(std::move(name)) {}

  std::string_view name() const override { return name_; }

  std::shared_ptr<CallCounts> counts = std::make_shared<CallCounts>();

 protected:
  void supports(const AttentionSpec& s, Pass pass, const Target&, Support& sup) const override {
    counts->checks++;
    sup.require(s.dtype == DType::f32 || s.dtype == DType::f64, ReasonCode::dtype,
                "dtype=" + std::string(to_string(s.dtype)) + " is not supported (f32, f64)");
    sup.require(s.head_dim_qk <= 256, ReasonCode::head_dim_qk,
                "head_dim_qk=" + std::to_string(s.head_dim_qk) + " exceeds the limit 256");
    if (pass == Pass::forward) {
      sup.require(s.head_dim_v <= 512, ReasonCode::head_dim_v,
                  "head_dim_v=" + std::to_string(s.head_dim_v) + " exceeds the forward limit 512");
    } else {
      sup.require(s.head_dim_qk == s.head_dim_v, ReasonCode::head_dim_mismatch,
                  "backward needs head_dim_qk == head_dim_v, got " + std::to_string(s.head_dim_qk) + "/" +
                      std::to_string(s.head_dim_v));
      sup.require(s.head_dim_v <= 256, ReasonCode::head_dim_v,
                  "head_dim_v=" + std::to_string(s.head_dim_v) + " exceeds the backward limit 256");
      // Like TransformerEngine's backends that take sinks in forward only.
      sup.require(s.softmax_type != SoftmaxType::learnable, ReasonCode::sinks,
                  "softmax_type=learnable: no gradient for the sink logits in backward");
    }
    // Every pass says how it runs, so tests can see which notes an explanation shows.
    sup.note(std::string(to_string(pass)) + " computed through the reference (a test backend)");
  }

  std::size_t scratch_bytes(const AttentionSpec& s, Pass pass, const Target&) const override {
    return reference_->workspace_bytes(s, pass);
  }

  void run_forward(const ForwardArgs& a) const override {
    counts->forwards++;
    reference_->forward(a);
  }
  void run_backward(const BackwardArgs& a) const override {
    counts->backwards++;
    reference_->backward(a);
  }

 private:
  std::string name_;
  std::shared_ptr<const Backend> reference_ = make_reference_backend();
};

}  // namespace attend::testing
