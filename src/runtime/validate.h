// Internal: tensor validation without re-validating the spec, for callers that
// validated it once already (plans validate their spec when they are made).
#pragma once

#include "attend/backend.h"

namespace attend::detail {

// inputs_checked: the input tensors' shapes were validated already
// (validate_input_shapes); the outputs, gradients and contents still are.
void validate_forward_tensors(const ForwardArgs& args, bool inputs_checked = false);
void validate_backward_tensors(const BackwardArgs& args, bool inputs_checked = false);

}  // namespace attend::detail
