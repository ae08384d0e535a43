// libFuzzer entry point of the npy target (see targets.h).
#include <cstddef>
#include <cstdint>

#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attend_fuzz::npy(data, size);
  return 0;
}
