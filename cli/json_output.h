// --json output of the attend tool: one JSON object on stdout per command, also
// when the command fails (then with "error" and the exit code), so scripts
// never have to parse the human text or stderr.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "attend/error.h"

namespace attend_cli {

// A JSON object built field by field, in insertion order.
class JsonObject {
 public:
  JsonObject& str(std::string_view key, std::string_view value);
  JsonObject& num(std::string_view key, double value);  // non-finite values become null
  JsonObject& integer(std::string_view key, std::int64_t value);
  JsonObject& boolean(std::string_view key, bool value);
  // `json` must already be a JSON value (object, array, literal).
  JsonObject& raw(std::string_view key, std::string_view json);
  std::string text() const { return "{" + body_ + "}"; }

 private:
  void key(std::string_view k);
  std::string body_;
};

// {"code", "field", "value", "limit", "message"} of an attend::Error.
std::string error_json(const attend::Error& e);
// {"code": "usage", "message"} for a command-line usage error.
std::string usage_error_json(std::string_view message);

// `object` (a JSON object's text) with `fields` ("\"k\": v, ...") appended
// before its closing brace: adds the error and exit code to to_json() output.
std::string with_fields(std::string object, const std::string& fields);

}  // namespace attend_cli
