#include "attend/tensor.h"

#include <cstring>
#include <new>
#include <string>

#include "attend/error.h"
#include "runtime/checked.h"
#include "runtime/host_memory.h"

namespace attend {

std::string_view to_string(Layout layout) {
  switch (layout) {
    case Layout::bshd: return "bshd";
    case Layout::bhsd: return "bhsd";
    case Layout::sbhd: return "sbhd";
    case Layout::thd: return "thd";
  }
  return "?";
}

Layout parse_layout(std::string_view text) {
  if (text == "bshd") return Layout::bshd;
  if (text == "bhsd") return Layout::bhsd;
  if (text == "sbhd") return Layout::sbhd;
  if (text == "thd") return Layout::thd;
  throw Error(ErrorCode::invalid_argument, "layout", std::string(text),
              "unknown layout; expected bshd, bhsd, sbhd or thd");
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n = detail::checked_mul(n, shape[d], "numel");
  return n;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::span<const std::int64_t> shape) {
  if (shape.size() > static_cast<std::size_t>(kMaxDims)) {
    throw Error(ErrorCode::invalid_argument, "ndim", std::to_string(shape.size()), "too many dimensions",
                std::to_string(kMaxDims));
  }
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (std::int64_t s : shape) {
    if (s < 0) {
      throw Error(ErrorCode::invalid_argument, "shape[" + std::to_string(d) + "]", std::to_string(s),
                  "dimensions must be non-negative");
    }
    v.shape[d++] = s;
  }
  std::int64_t stride = 1;
  for (d = v.ndim - 1; d >= 0; --d) {
    v.strides[d] = stride;
    stride = detail::checked_mul(stride, v.shape[d], "strides");
  }
  return v;
}

std::string TensorView::shape_string() const {
  std::string s = "(";
  for (int d = 0; d < ndim; ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + ")";
}

Tensor Tensor::allocate(TensorView view) {
  const std::size_t bytes = detail::checked_bytes(view.numel(), size_of(view.dtype), "tensor bytes");
  std::shared_ptr<void> storage;
  try {
    const std::size_t size = bytes == 0 ? 1 : bytes;
    void* p = detail::host_allocate(size);
    // If the control block cannot be allocated, shared_ptr frees p itself.
    storage = std::shared_ptr<void>(p, [size](void* q) { detail::host_free(q, size); });
    // Zeros, so padding rows and empty sequences read as 0.
    std::memset(p, 0, size);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::out_of_memory, "tensor bytes", std::to_string(bytes), "allocation failed");
  }
  view.data = storage.get();
  Tensor t;
  t.storage_ = std::move(storage);
  t.view_ = view;
  return t;
}

Tensor Tensor::zeros(DType dtype, std::span<const std::int64_t> shape) {
  return allocate(TensorView::contiguous(nullptr, dtype, shape));
}

Tensor Tensor::zeros_like(const TensorView& view) {
  TensorView v = view;
  std::int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.strides[d] = stride;
    stride = detail::checked_mul(stride, v.shape[d], "strides");
  }
  return allocate(v);
}

Tensor Tensor::empty(DType dtype, std::span<const std::int64_t> shape, Device device, Allocator& allocator) {
  TensorView view = TensorView::contiguous(nullptr, dtype, shape);
  view.device = device;
  const std::size_t bytes = detail::checked_bytes(view.numel(), size_of(dtype), "tensor bytes");
  void* p = nullptr;
  try {
    p = allocator.allocate(bytes == 0 ? 1 : bytes, device);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::out_of_memory, "tensor bytes", std::to_string(bytes),
                "allocation failed on " + to_string(device));
  }
  if (p == nullptr) {
    throw Error(ErrorCode::out_of_memory, "tensor bytes", std::to_string(bytes),
                "allocator returned null on " + to_string(device));
  }
  view.data = p;
  Tensor t;
  t.storage_ = std::shared_ptr<void>(
      p, [&allocator, bytes, device](void* q) { allocator.deallocate(q, bytes == 0 ? 1 : bytes, device); });
  t.view_ = view;
  return t;
}

}  // namespace attend
