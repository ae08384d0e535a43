// Conversions between torch tensors and attend's views and tensors.
//
// attend reads strided memory directly: a torch tensor becomes a TensorView with
// the same data pointer and element strides. Only a last dimension that is not
// contiguous forces a copy (attend's one layout rule), and attend never modifies
// its inputs, so views of user tensors are safe to hand over.
#pragma once

#include <ATen/ATen.h>

#include "attend/tensor.h"

namespace attend::python {

// The attend element type of a torch dtype; attend::Error(invalid_argument)
// naming `name` for dtypes attend cannot even describe (ints other than i32,
// complex, bool, ...). bf16/f16 map to attend's describable-but-unsupported types
// so that selection explains why no backend computes them.
DType dtype_of(const at::Tensor& t, const char* name);

// `t` itself, or a copy whose last dimension is contiguous when it was not.
// Throws attend::Error for non-CPU tensors and more than TensorView::kMaxDims dims.
at::Tensor prepare(const at::Tensor& t, const char* name);

// A view of `t` (after prepare()); `t` must outlive the view.
TensorView view_of(const at::Tensor& t, const char* name);

// A torch tensor sharing the storage of `t` (no copy): the storage lives as long
// as either side holds it.
at::Tensor to_torch(const Tensor& t);

}  // namespace attend::python
