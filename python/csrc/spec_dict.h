// AttentionSpec <-> Python dict, by the spec-field table (attend/spec_fields.h).
//
// Python never lists the fields: it hands a dict over and the table parses it,
// so a field added in C++ is a Python keyword without a Python change, and a
// bad value fails with the C++ error that names the field.
#pragma once

#include <pybind11/pybind11.h>

#include "attend/spec.h"

namespace attend::python {

// The spec these fields describe (the rest at their defaults). An unknown key
// or a malformed value is an attend::Error naming the field.
AttentionSpec spec_from_dict(const pybind11::dict& fields);

// Every field of `spec` by name, in the form spec_from_dict accepts back.
pybind11::dict spec_dict(const AttentionSpec& spec);

// The table itself: per field a dict (name, kind, optional, help, default).
pybind11::list spec_field_table();

}  // namespace attend::python
