// libFuzzer entry point of the cli_flags target (see targets.h).
#include <cstddef>
#include <cstdint>

#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attend_fuzz::cli_flags(data, size);
  return 0;
}
