// The reference backend: the oracle every other backend is tested against.
//
// It materialises the score matrix of one (batch, head) at a time, supports every
// spec field in both passes for f32 and f64, and is written for clarity, not speed.
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
};

std::shared_ptr<const Backend> make_reference_backend(ReferenceOptions options = {});

}  // namespace attend
