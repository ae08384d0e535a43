#include "spec_dict.h"

#include <optional>
#include <string>
#include <type_traits>
#include <variant>

#include "attend/error.h"
#include "attend/spec_fields.h"

namespace py = pybind11;

namespace attend::python {
namespace {

[[noreturn]] void bad_field(const std::string& key, const std::string& value, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, key, value, why);
}

// A Python value as the text set_field parses, chosen by the field's kind, so
// that parsing (and its errors, which name the field) is the C++ one. Text is
// passed through: set_field then says what it expected.
std::string field_text(const SpecField& f, const py::handle& val) {
  const std::string key(f.name);
  if (val.is_none()) {
    if (field_optional(f)) return "";
    bad_field(key, "None", "cannot be unset (only optional fields, e.g. scale, out_dtype, take None)");
  }
  if (py::isinstance<py::str>(val)) return val.cast<std::string>();
  // A Python int has no width: its digits go to set_field, which names one
  // outside the field's range (a seed of 2^64) instead of calling it a wrong type.
  const FieldKind kind = field_kind(f);
  if ((kind == FieldKind::integer || kind == FieldKind::unsigned_integer) && py::isinstance<py::int_>(val) &&
      !py::isinstance<py::bool_>(val)) {
    return std::string(py::str(val));
  }
  try {
    switch (field_kind(f)) {
      case FieldKind::boolean: return val.cast<bool>() ? "true" : "false";
      case FieldKind::integer: return std::to_string(val.cast<std::int64_t>());
      case FieldKind::unsigned_integer: return std::to_string(val.cast<std::uint64_t>());
      case FieldKind::real: return py::repr(py::float_(py::reinterpret_borrow<py::object>(val))).cast<std::string>();
      case FieldKind::dtype:
      case FieldKind::layout:
      case FieldKind::softmax_type:
      case FieldKind::kv_scale: break;  // names only: a str, handled above
    }
  } catch (const py::error_already_set&) {
  } catch (const py::cast_error&) {
  }
  bad_field(key, std::string(py::str(val)),
            "has the wrong type (" + std::string(py::str(py::type::of(val))) + "; expected " +
                std::string(to_string(field_kind(f))) + ")");
}

py::object field_value(const AttentionSpec& s, const SpecField& f) {
  return std::visit(
      [&](auto member) -> py::object {
        const auto& v = s.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, DType> || std::is_same_v<T, Layout> || std::is_same_v<T, SoftmaxType> ||
                      std::is_same_v<T, KVScale>)
          return py::str(std::string(to_string(v)));
        else if constexpr (std::is_same_v<T, std::optional<DType>>) {
          return v ? py::object(py::str(std::string(to_string(*v)))) : py::none();
        } else if constexpr (std::is_same_v<T, std::optional<double>>) {
          return v ? py::object(py::float_(*v)) : py::none();
        } else {
          return py::cast(v);
        }
      },
      f.member);
}

}  // namespace

AttentionSpec spec_from_dict(const py::dict& d) {
  AttentionSpec s;
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    const SpecField* f = find_spec_field(key);
    if (f == nullptr) bad_field(key, "", "not a field of attend::AttentionSpec (attend.spec_fields() lists them)");
    set_field(s, *f, field_text(*f, item.second));
  }
  return s;
}

py::dict spec_dict(const AttentionSpec& s) {
  py::dict d;
  for (const SpecField& f : spec_fields()) d[py::str(std::string(f.name))] = field_value(s, f);
  return d;
}

py::list spec_field_table() {
  const AttentionSpec defaults;
  py::list out;
  for (const SpecField& f : spec_fields()) {
    py::dict row;
    row["name"] = std::string(f.name);
    row["kind"] = std::string(to_string(field_kind(f)));
    row["optional"] = field_optional(f);
    row["help"] = std::string(f.help);
    row["default"] = field_value(defaults, f);
    out.append(row);
  }
  return out;
}

}  // namespace attend::python
