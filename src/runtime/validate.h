// Internal: tensor validation without re-validating the spec, for callers that
// validated it once already (plans validate their spec when they are made).
#pragma once

#include "attend/backend.h"

namespace attend::detail {

void validate_forward_tensors(const ForwardArgs& args);
void validate_backward_tensors(const BackwardArgs& args);

}  // namespace attend::detail
