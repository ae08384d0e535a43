// The unfused baseline: attention as a user would write it with OpenBLAS.
//
// Per (batch, head): S = scale * Q K^T (cblas_sgemm reading the caller's strided
// tensors through lda), -inf outside the causal/window mask (attend's rules,
// kernel/semantics.h), a plain row softmax with std::exp, O = P V (cblas_sgemm).
// Training keeps P of every head; backward then runs, per head,
//   dV += P^T dO,  dP = dO V^T,  dS = P o (dP - rowsum(dP o P)),
//   dQ = scale * dS K,  dK += scale * dS^T Q          (cblas_sgemm; += over a GQA group).
// Heads run one per OpenMP thread with OpenBLAS single-threaded, the usual way
// to run many independent GEMMs: a threaded sgemm per head next to an OpenMP
// softmax makes the two thread pools spin against each other on the cores
// (measured: 10-100x slower on small heads). Backward tasks are (batch, kv head)
// so that a GQA group's dK/dV accumulate in order, without atomics.
// The work is never reduced by the mask: the full score matrix is computed, as
// in the code this baseline stands for. Its extra memory grows with Sq*Sk.
//
// Scope: f32, dense layouts (bshd, bhsd, sbhd), GQA/MQA, causal and window masks.
// Everything else (softcap, ALiBi, bias, dropout, varlen, other dtypes) is
// declined by check() with one reason per unmet condition.
#pragma once

#include <cstddef>
#include <memory>

#include "attend/backend.h"
#include "attend/spec.h"
#include "attend/tensor.h"

namespace attend::bench {

class UnfusedAttention {
 public:
  // Pure: the conditions above, as attend::Support.
  static Support check(const AttentionSpec& spec);

  // Throws attend::Error(unsupported) with check()'s reasons, or the spec's own
  // validation error.
  explicit UnfusedAttention(const AttentionSpec& spec);

  // out: spec.layout, (.., H, Dv), f32. With keep_probs, P of every (batch,
  // head) is kept for backward() (B*H*Sq*Sk floats); without, one Sq x Sk
  // buffer per thread is reused. Inputs are validated (attend::validate_inputs).
  void forward(const Inputs& in, const TensorView& out, bool keep_probs);

  // Needs a preceding forward(..., keep_probs = true) on the same inputs.
  // dq, dk, dv: the shapes of q, k, v, f32; overwritten (dk/dv summed over the group).
  void backward(const Inputs& in, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv);

  // Scratch bytes of a pass: forward, one score matrix per thread; backward,
  // the kept probabilities of every head plus one dP per thread.
  std::size_t extra_bytes(Pass pass) const;

  const AttentionSpec& spec() const { return spec_; }
  // OpenMP threads the baseline runs on (omp_get_max_threads() at construction).
  int threads() const { return threads_; }

 private:
  // Grow-only f32 buffers from attend's host allocator (the same page size as
  // attend's tensors: huge pages for large ones), so that the baseline is not
  // slowed by TLB misses the flash inputs do not have.
  float* buffer(Tensor& buf, std::size_t need, const char* what);

  AttentionSpec spec_;
  Tensor scores_, probs_, dprobs_;
  bool have_probs_ = false;
  int threads_ = 1;
};

}  // namespace attend::bench
