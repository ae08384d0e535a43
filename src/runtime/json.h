// JSON string escaping, shared by the selection's to_json(), the CLI's --json
// output and the benchmark's JSON report so that all three quote alike.
#pragma once

#include <string>
#include <string_view>

namespace attend::detail {

// `s` with '"', '\\' and control characters escaped (no surrounding quotes).
std::string json_escape(std::string_view s);

// `s` escaped and in double quotes: a JSON string value.
inline std::string json_quote(std::string_view s) { return "\"" + json_escape(s) + "\""; }

}  // namespace attend::detail
