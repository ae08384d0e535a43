// The reference backend: the oracle every other backend is tested against.
//
// It materialises the score matrix of one (batch, head) at a time, supports every
// spec field in both passes for f32 and f64 (bf16/f16 by upcasting: f32 LSE,
// outputs and gradients rounded to the input dtype once, at the end), and is
// written for clarity, not speed.
#pragma once

#include <cstddef>
#include <memory>

#include "attend/backend.h"

namespace attend {

struct ReferenceOptions {
  // Accumulate dot products, softmax sums and gradients in double even for f32
  // inputs (the default: the reference is an oracle). false accumulates in the
  // input type, which is useful as a "same precision" baseline.
  bool accumulate_f64 = true;
  // Largest score-matrix working set (bytes) the backend accepts; bigger
  // problems are declined with a `memory` reason so that the selector moves on.
  std::size_t max_score_bytes = std::size_t{8} << 30;
  // bf16/f16 inputs are always upcast element by element and computed in the
  // accumulation type (LSE in f32). With this flag (and accumulate_f64 = false)
  // the backend instead models a naive same-precision implementation: every
  // intermediate matrix — scaled scores, softcap, P (and P' with dropout), dP,
  // D, dS — is rounded to the input dtype, while each dot product accumulates in
  // f32, as half-precision matmuls and softmaxes do in PyTorch. This is the
  // "err_pt" baseline of FlashAttention's tolerance rule (docs/semantics.md §7).
  // No effect for f32 with f32 accumulation or for f64.
  bool round_intermediates_to_input_dtype = false;
};

std::shared_ptr<const Backend> make_reference_backend(ReferenceOptions options = {});

}  // namespace attend
