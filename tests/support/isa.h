// ATTEND_ISA forces one kernel family (the CTest runs of the flash and decode
// suites set it per family); forcing one this CPU lacks makes every flash and
// decode call an attend::Error by design, so tests of those kernels skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>

#include "attend/backends/flash.h"

namespace attend::testing {

inline bool forced_isa_unavailable() {
  const char* isa = std::getenv("ATTEND_ISA");
  return isa != nullptr && *isa != '\0' && !flash_isa_supported(isa);
}

}  // namespace attend::testing

#define SKIP_IF_FORCED_ISA_UNAVAILABLE()                                                      \
  do {                                                                                        \
    if (::attend::testing::forced_isa_unavailable()) GTEST_SKIP() << "CPU lacks ATTEND_ISA"; \
  } while (0)
