// Internal glue between policy.cpp and select.cpp.
#pragma once

#include <string>

#include "attend/select.h"

namespace attend::detail {

// A string that differs whenever two policies could select differently; part of
// the selection cache key.
std::string policy_key(const Policy& policy);

}  // namespace attend::detail
