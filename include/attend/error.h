// attend::Error — the one exception type of the library.
//
// Every failure a caller can provoke (bad shapes, unsupported problems, malformed
// files, allocation failure) is reported as an attend::Error that names the
// offending field, the value it had and, where one exists, the limit it broke.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace attend {

// Broad category of an error; stable, meant for programmatic handling.
enum class ErrorCode {
  invalid_argument,  // a field of the spec or a tensor is malformed
  shape_mismatch,    // tensors disagree with the spec or with each other
  overflow,          // a size computation would overflow size_t / int64
  unsupported,       // no backend (or the forced one) can run the problem
  bad_state,         // e.g. backward on an inference context
  io,                // file could not be read or parsed (.npy)
  out_of_memory,     // an allocation failed
};

std::string_view to_string(ErrorCode code);

class Error : public std::runtime_error {
 public:
  // `field` names what was wrong ("head_dim_v", "cu_seqlens_q[3]"), `value` is its
  // rendered value and `limit` the bound it broke (may be empty). `detail` is the
  // human sentence; the what() string combines all of them.
  Error(ErrorCode code, std::string field, std::string value, std::string detail,
        std::string limit = {});

  ErrorCode code() const noexcept { return code_; }
  const std::string& field() const noexcept { return field_; }
  const std::string& value() const noexcept { return value_; }
  const std::string& limit() const noexcept { return limit_; }
  const std::string& detail() const noexcept { return detail_; }

 private:
  ErrorCode code_;
  std::string field_, value_, limit_, detail_;
};

}  // namespace attend
