// Context-parallel planning for Python (attend.parallel).
#pragma once

#include <pybind11/pybind11.h>

namespace attend::python {

// Adds _C.cp_plan.
void bind_parallel(pybind11::module_& m);

}  // namespace attend::python
