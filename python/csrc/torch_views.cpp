#include "torch_views.h"

#include <string>
#include <vector>

#include "attend/error.h"

namespace attend::python {

DType dtype_of(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::f32;
    case at::kDouble: return DType::f64;
    case at::kBFloat16: return DType::bf16;
    case at::kHalf: return DType::f16;
    case at::kInt: return DType::i32;
    default:
      throw Error(ErrorCode::invalid_argument, std::string(name) + ".dtype", std::string(c10::toString(t.scalar_type())),
                  "attend handles float32, float64, bfloat16, float16 and int32 index tensors");
  }
}

at::Tensor prepare(const at::Tensor& t, const char* name) {
  if (!t.defined()) {
    throw Error(ErrorCode::invalid_argument, name, "undefined", "expected a tensor");
  }
  if (!t.device().is_cpu()) {
    throw Error(ErrorCode::invalid_argument, std::string(name) + ".device", t.device().str(),
                "attend computes on the CPU; move the tensor with .cpu()");
  }
  if (t.dim() < 1 || t.dim() > TensorView::kMaxDims) {
    throw Error(ErrorCode::invalid_argument, std::string(name) + ".dim", std::to_string(t.dim()),
                "expected 1 to " + std::to_string(TensorView::kMaxDims) + " dimensions");
  }
  if (t.is_sparse() || t.is_quantized()) {
    throw Error(ErrorCode::invalid_argument, std::string(name) + ".layout", "sparse/quantized",
                "attend needs a dense strided tensor");
  }
  // A view with conjugate/negative bits would be read without them.
  at::Tensor r = t.resolve_conj().resolve_neg();
  if (r.size(-1) > 1 && r.stride(-1) != 1) r = r.contiguous();
  return r;
}

TensorView view_of(const at::Tensor& t, const char* name) {
  TensorView v;
  v.dtype = dtype_of(t, name);
  v.ndim = static_cast<int>(t.dim());
  v.data = t.numel() > 0 ? t.data_ptr() : nullptr;
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  // torch gives size-1 dims arbitrary strides; attend wants the last one to be 1.
  if (v.shape[v.ndim - 1] <= 1) v.strides[v.ndim - 1] = 1;
  return v;
}

at::Tensor to_torch(const Tensor& t) {
  const TensorView& v = t.view();
  at::ScalarType st = at::kFloat;
  switch (v.dtype) {
    case DType::f32: st = at::kFloat; break;
    case DType::f64: st = at::kDouble; break;
    case DType::bf16: st = at::kBFloat16; break;
    case DType::f16: st = at::kHalf; break;
    case DType::i32: st = at::kInt; break;
  }
  const std::vector<std::int64_t> sizes(v.shape.begin(), v.shape.begin() + v.ndim);
  const std::vector<std::int64_t> strides(v.strides.begin(), v.strides.begin() + v.ndim);
  if (t.numel() == 0 || v.data == nullptr) return at::zeros(sizes, at::TensorOptions().dtype(st));
  // The deleter owns a copy of the attend::Tensor: the shared storage is released
  // when the torch tensor (and attend's own references) are gone.
  return at::from_blob(v.data, sizes, strides, [keep = t](void*) mutable { keep = Tensor(); },
                       at::TensorOptions().dtype(st));
}

}  // namespace attend::python
