#include "views.h"

#include <string>

#include "attend/error.h"

namespace py = pybind11;

namespace attend::python {

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& value, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, field, value, why);
}

std::string text(const py::handle& h) { return std::string(py::str(h)); }

}  // namespace

TensorView view_of(const py::handle& desc, const std::string& name) {
  TensorView v;
  if (desc.is_none()) return v;
  if (!py::isinstance<py::tuple>(desc) || py::len(desc) != 4) {
    bad(name, text(desc), "expected a (data, dtype, shape, strides) descriptor");
  }
  const auto t = py::reinterpret_borrow<py::tuple>(desc);
  const auto shape = t[2].cast<py::tuple>();
  const auto strides = t[3].cast<py::tuple>();
  const auto ndim = static_cast<int>(py::len(shape));
  if (ndim < 1 || ndim > TensorView::kMaxDims) {
    bad(name + ".dim", std::to_string(ndim), "expected 1 to " + std::to_string(TensorView::kMaxDims) + " dimensions");
  }
  if (py::len(strides) != py::len(shape)) {
    bad(name + ".strides", text(strides), "must have one entry per dimension");
  }
  v.dtype = parse_dtype(t[1].cast<std::string>(), name + ".dtype");
  v.ndim = ndim;
  bool empty = false;
  for (int d = 0; d < ndim; ++d) {
    v.shape[d] = shape[d].cast<std::int64_t>();
    v.strides[d] = strides[d].cast<std::int64_t>();
    if (v.shape[d] < 0) bad(name + ".shape", text(shape), "sizes must be non-negative");
    if (v.shape[d] == 0) empty = true;
  }
  // Array libraries give size-1 dims arbitrary strides; attend wants the last one to be 1.
  if (v.shape[ndim - 1] <= 1) v.strides[ndim - 1] = 1;
  // An empty array addresses nothing, so its strides are free (torch's gradient
  // of x.sum() for an empty x has every stride 0): the last one reads as 1.
  if (empty) v.strides[ndim - 1] = 1;
  if (v.strides[ndim - 1] != 1) {
    bad(name + ".strides", text(strides), "the last dimension must be contiguous");
  }
  // An empty array may have no storage (address 0) and is never read.
  v.data = empty ? nullptr : reinterpret_cast<void*>(t[0].cast<std::uintptr_t>());
  return v;
}

Inputs inputs_of(const py::dict& tensors) {
  Inputs in;
  TensorView Inputs::*const members[] = {&Inputs::q,
                                         &Inputs::k,
                                         &Inputs::v,
                                         &Inputs::bias,
                                         &Inputs::alibi_slopes,
                                         &Inputs::cu_seqlens_q,
                                         &Inputs::cu_seqlens_kv,
                                         &Inputs::block_table,
                                         &Inputs::cache_seqlens,
                                         &Inputs::cache_leftpad,
                                         &Inputs::sinks,
                                         &Inputs::k_scale,
                                         &Inputs::v_scale};
  const char* const names[] = {"q",
                               "k",
                               "v",
                               "bias",
                               "alibi_slopes",
                               "cu_seqlens_q",
                               "cu_seqlens_kv",
                               "block_table",
                               "cache_seqlens",
                               "cache_leftpad",
                               "sinks",
                               "k_scale",
                               "v_scale"};
  for (const auto& item : tensors) {
    const std::string key = py::str(item.first);
    bool found = false;
    for (std::size_t i = 0; i < std::size(names); ++i) {
      if (key == names[i]) {
        in.*members[i] = view_of(item.second, key);
        found = true;
      }
    }
    if (!found)
      bad(key, "",
          "not an input of attend (expected q, k, v, bias, alibi_slopes, cu_seqlens_*, block_table, cache_*, sinks, "
          "k_scale, v_scale)");
  }
  return in;
}

}  // namespace attend::python
