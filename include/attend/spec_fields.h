// The table of AttentionSpec fields: one row per field, the single list from
// which signature(), describe(), spec_to_json(), the CLI's problem flags and the
// Python keyword arguments are derived, so a new field is added in one place.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "attend/spec.h"

namespace attend {

// How a field takes part in the selection cache key.
enum class KeyUse : std::uint8_t {
  exact,   // any change may change the verdicts
  bucket,  // a size whose exact value rarely matters: keyed by its power-of-two
           // bucket; a cached selection is re-checked on the exact spec before use
  none,    // never changes a verdict (the dropout seed)
};

struct SpecField {
  using Member = std::variant<std::int64_t AttentionSpec::*, std::uint64_t AttentionSpec::*, double AttentionSpec::*,
                              bool AttentionSpec::*, DType AttentionSpec::*, Layout AttentionSpec::*,
                              std::optional<double> AttentionSpec::*, std::optional<DType> AttentionSpec::*,
                              SoftmaxType AttentionSpec::*, KVScale AttentionSpec::*>;
  std::string_view name;  // the C++ member, JSON key and Python keyword
  Member member;
  KeyUse key = KeyUse::exact;
  std::string_view help;  // one line, with units and the meaning of the default
};

// The kind of value a field holds, for front ends that type their arguments
// (the CLI's flags, Python's keywords): int (int64), uint (uint64), real, bool,
// dtype, layout, softmax_type or kv_scale (by name).
enum class FieldKind : std::uint8_t { integer, unsigned_integer, real, boolean, dtype, layout, softmax_type, kv_scale };
std::string_view to_string(FieldKind kind);
FieldKind field_kind(const SpecField& field);
// An optional field may be unset: "" in get_field/set_field.
bool field_optional(const SpecField& field);

// Every field of AttentionSpec, in declaration order.
std::span<const SpecField> spec_fields();
// The row called `name`, or nullptr.
const SpecField* find_spec_field(std::string_view name);

// The field's value as text: integers and reals in decimal ("0.125"), booleans
// "true"/"false", dtypes, layouts and softmax types by name, an unset optional as "".
std::string get_field(const AttentionSpec& spec, const SpecField& field);
// Parses `text` in the form get_field writes ("" unsets an optional) and
// stores it. Throws attend::Error naming the field and the text when it does
// not parse; range checks are validate()'s.
void set_field(AttentionSpec& spec, const SpecField& field, std::string_view text);

// {"batch": 1, "seqlen_q": 1024, ..., "scale": null}: every field by name.
std::string spec_to_json(const AttentionSpec& spec);

}  // namespace attend
