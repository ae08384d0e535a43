// --check: compare the tool's results against the f64 reference backend.
#pragma once

#include <string>
#include <vector>

#include "attend/attention.h"
#include "problem_data.h"

namespace attend_cli {

struct ErrorStats {
  std::string name;
  double max_abs_err = 0.0;  // max |got - ref| (equal infinities count as 0; NaN propagates)
  double max_ref = 0.0;      // max |ref| over finite entries
  double max_rel_err = 0.0;  // max_abs_err / max_ref (max_abs_err when max_ref is 0)
};

// Converts the inputs to f64 and runs make_reference_backend() directly on an
// f64 copy of the spec; compares out and lse (when written) and, with
// `grads`, dq, dk, dv (and dbias). 8-bit K/V (spec.kv_dtype) enter the
// reference as the values they stand for, code * scale: the errors are the
// kernel's on the quantized K/V, without the quantization error.
std::vector<ErrorStats> check_against_reference(const Problem& p, const ProblemData& data,
                                                const attend::ForwardResult& fwd,
                                                const attend::Gradients* grads);

// The tolerance on max_rel_err used when --tolerance is not given.
double default_tolerance(attend::DType dtype);

}  // namespace attend_cli
