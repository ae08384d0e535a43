// Internal: scratch tensors of a problem's shape for autotune to time plans on.
// The caller's tensors are never touched: a losing candidate cannot write into
// them, and tuning happens once per bucket, before any caller data exists.
#pragma once

#include <vector>

#include "attend/backend.h"
#include "attend/tensor.h"

namespace attend::detail {

struct TuneData {
  std::vector<Tensor> owned;  // storage behind every view below
  Inputs in;
  TensorView out, lse, dout, dq, dk, dv, dbias;
};

// Host tensors for `spec`, filled with small pseudo-random values (so kernels
// take their ordinary paths), varlen sequences and paged caches filled to
// their maxima. Throws attend::Error(out_of_memory) when they do not fit.
TuneData make_tune_data(const AttentionSpec& spec, Mode mode);

}  // namespace attend::detail
