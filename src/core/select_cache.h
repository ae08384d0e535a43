// Internal: the cached selection, shared between select() and the contexts that
// forward() hands out (backward must run on exactly this backend).
#pragma once

#include <memory>

#include "attend/select.h"

namespace attend::detail {

std::shared_ptr<const Selection> select_shared(const AttentionSpec& spec, Mode mode, const Policy& policy);

}  // namespace attend::detail
