#include "json_output.h"

#include <cmath>
#include <cstdio>

#include "runtime/json.h"

namespace attend_cli {

using attend::detail::json_quote;

void JsonObject::key(std::string_view k) {
  if (!body_.empty()) body_ += ", ";
  body_ += json_quote(k) + ": ";
}

JsonObject& JsonObject::str(std::string_view k, std::string_view value) {
  key(k);
  body_ += json_quote(value);
  return *this;
}

JsonObject& JsonObject::num(std::string_view k, double value) {
  key(k);
  if (!std::isfinite(value)) {
    body_ += "null";
    return *this;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  body_ += buf;
  return *this;
}

JsonObject& JsonObject::integer(std::string_view k, std::int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::boolean(std::string_view k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}

JsonObject& JsonObject::raw(std::string_view k, std::string_view json) {
  key(k);
  body_ += json;
  return *this;
}

std::string error_json(const attend::Error& e) {
  return JsonObject()
      .str("code", attend::to_string(e.code()))
      .str("field", e.field())
      .str("value", e.value())
      .str("limit", e.limit())
      .str("message", e.what())
      .text();
}

std::string usage_error_json(std::string_view message) {
  return JsonObject().str("code", "usage").str("message", message).text();
}

std::string with_fields(std::string object, const std::string& fields) {
  const std::size_t close = object.find_last_of('}');
  if (close == std::string::npos) return object;
  const bool empty = object.find_first_not_of(" \n{", 0) >= close;
  object.insert(close, (empty ? "" : ", ") + fields);
  return object;
}

}  // namespace attend_cli
