// Tensors as the Python side describes them: no array library in C++.
//
// The extension links no libtorch and no numpy: Python adapters
// (attend/_arrays.py) turn a torch tensor, a numpy array or any DLPack exporter
// into a descriptor tuple (data address, dtype name, shape, strides in
// elements) and keep the object alive for as long as the native side reads it.
// One built extension therefore serves every torch version and numpy alone.
#pragma once

#include <pybind11/pybind11.h>

#include "attend/backend.h"
#include "attend/tensor.h"

namespace attend::python {

// The view a descriptor describes; None (or an absent entry) is an undefined
// view. Throws attend::Error naming `name` for a malformed descriptor, more
// than TensorView::kMaxDims dims, negative sizes or a non-unit last stride.
TensorView view_of(const pybind11::handle& desc, const std::string& name);

// Inputs from a dict of descriptors by Inputs member name (q, k, v, bias,
// alibi_slopes, cu_seqlens_q, cu_seqlens_kv, block_table, cache_seqlens,
// cache_leftpad); an unknown key is an error naming it.
Inputs inputs_of(const pybind11::dict& tensors);

}  // namespace attend::python
