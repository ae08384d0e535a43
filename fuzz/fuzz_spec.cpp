// libFuzzer entry point of the spec target (see targets.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "targets.h"

// One kernel thread: the problems are tiny, and an OpenMP team spinning between
// runs would cost more than the kernels (and make executions nondeterministic).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ::setenv("ATTEND_NUM_THREADS", "1", 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attend_fuzz::spec(data, size);
  return 0;
}
