#include "attend/error.h"

namespace attend {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::shape_mismatch: return "shape_mismatch";
    case ErrorCode::overflow: return "overflow";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::bad_state: return "bad_state";
    case ErrorCode::io: return "io";
    case ErrorCode::out_of_memory: return "out_of_memory";
  }
  return "unknown";
}

namespace {
std::string compose(ErrorCode code, const std::string& field, const std::string& value, const std::string& detail,
                    const std::string& limit) {
  std::string s = "attend [" + std::string(to_string(code)) + "] ";
  if (!field.empty()) {
    s += field;
    if (!value.empty()) s += "=" + value;
    s += ": ";
  }
  s += detail;
  if (!limit.empty()) s += " (limit: " + limit + ")";
  return s;
}
}  // namespace

Error::Error(ErrorCode code, std::string field, std::string value, std::string detail, std::string limit)
    : std::runtime_error(compose(code, field, value, detail, limit)),
      code_(code),
      field_(std::move(field)),
      value_(std::move(value)),
      limit_(std::move(limit)),
      detail_(std::move(detail)) {}

}  // namespace attend
