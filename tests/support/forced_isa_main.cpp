// gtest main of the suites CTest runs once per kernel family (ATTEND_ISA=<family>,
// tests/CMakeLists.txt). A family this CPU lacks cannot run at all: every flash and
// decode call is an attend::Error(unsupported) by design. The whole run then reports
// as skipped (exit code 77, the tests' SKIP_RETURN_CODE) rather than failing, or
// passing without having run; an unknown family name still runs, and fails loudly.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "attend/backends/flash.h"
#include "attend/error.h"

namespace {

constexpr int kSkipReturnCode = 77;

// The reason to skip this run, or nullptr to run it.
const char* forced_family_unavailable() {
  const char* isa = std::getenv("ATTEND_ISA");
  if (isa == nullptr || *isa == '\0') return nullptr;
  try {
    (void)attend::flash_active_isa();
  } catch (const attend::Error& e) {
    if (e.code() == attend::ErrorCode::unsupported) return isa;
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!GTEST_FLAG_GET(list_tests)) {
    if (const char* isa = forced_family_unavailable()) {
      std::printf("[  SKIPPED ] ATTEND_ISA=%s: this CPU lacks that kernel family\n", isa);
      return kSkipReturnCode;
    }
  }
  return RUN_ALL_TESTS();
}
