#include <cstdio>
#include <cstdlib>
#include <span>

#include "attend/error.h"
#include "attend/npy.h"
#include "targets.h"

namespace attend_fuzz {

void npy(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  attend::Tensor t;
  try {
    t = attend::parse_npy(bytes, "fuzz.npy");
  } catch (const attend::Error&) {
    return;
  }
  // A parsed tensor owns exactly numel * itemsize bytes, all copied from the
  // tail of the input: the header must end where the data begins.
  const auto n = static_cast<std::size_t>(t.numel()) * attend::size_of(t.view().dtype);
  if (n > size) {
    std::fprintf(stderr, "parse_npy: %zu data bytes from a %zu-byte input\n", n, size);
    std::abort();
  }
  volatile std::uint8_t sink = 0;
  const auto* p = static_cast<const std::uint8_t*>(t.data());
  for (std::size_t i = 0; i < n; ++i) sink = static_cast<std::uint8_t>(sink ^ p[i]);  // ASan: in bounds
  // Round trip: the header we would write for it parses back to the same shape.
  const std::string header = attend::npy_header(t.view());
  std::string file = header;
  file.append(reinterpret_cast<const char*>(p), n);
  const attend::Tensor again =
      attend::parse_npy(std::span<const std::byte>(reinterpret_cast<const std::byte*>(file.data()), file.size()), "again");
  if (again.view().ndim != t.view().ndim || again.view().shape != t.view().shape ||
      again.view().dtype != t.view().dtype) {
    std::fprintf(stderr, "parse_npy: round trip changed the tensor\n");
    std::abort();
  }
}

}  // namespace attend_fuzz
