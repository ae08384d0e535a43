// Non-owning tensor views, memory layouts, and a small owning tensor.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "attend/device.h"
#include "attend/dtype.h"

namespace attend {

// How the dimensions of q, k, v, out (and their gradients) are ordered.
//   bshd: (batch, seqlen, heads, head_dim)      — FlashAttention's layout
//   bhsd: (batch, heads, seqlen, head_dim)      — PyTorch SDPA's layout
//   sbhd: (seqlen, batch, heads, head_dim)      — Megatron / TransformerEngine
//   thd:  (total_tokens, heads, head_dim)       — packed variable-length sequences;
//         sequence b owns rows [cu_seqlens[b], cu_seqlens[b+1]).
enum class Layout : std::uint8_t { bshd, bhsd, sbhd, thd };

std::string_view to_string(Layout layout);
Layout parse_layout(std::string_view text);

// A strided view of memory owned by someone else. Shape and strides are in
// elements (not bytes) and ordered as the layout names them. The last dimension
// must be contiguous (stride 1); other strides must be non-negative.
struct TensorView {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};
  std::array<std::int64_t, kMaxDims> strides{};
  // Where `data` lives. The runtime reads host tensors' contents (cu_seqlens,
  // block tables) to validate them and never dereferences device memory.
  Device device{};

  // True when the view describes a tensor (ndim > 0); an absent optional input
  // (no bias, no dbias) is a default-constructed view.
  bool defined() const { return ndim > 0; }
  // Product of the shape; throws attend::Error on int64 overflow.
  std::int64_t numel() const;
  // Row-major contiguous view over `data`.
  static TensorView contiguous(void* data, DType dtype, std::span<const std::int64_t> shape);
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
    return contiguous(data, dtype, std::span<const std::int64_t>(shape.begin(), shape.size()));
  }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  std::string shape_string() const;  // "(2, 1024, 16, 192)"
};

// An owning, contiguous tensor. Copies share the storage.
class Tensor {
 public:
  Tensor() = default;
  // Host tensor filled with zeros. Throws attend::Error(overflow) when the byte
  // size overflows and attend::Error(out_of_memory) when the allocation fails.
  static Tensor zeros(DType dtype, std::span<const std::int64_t> shape);
  static Tensor zeros(DType dtype, std::initializer_list<std::int64_t> shape) {
    return zeros(dtype, std::span<const std::int64_t>(shape.begin(), shape.size()));
  }
  // Same dtype and shape as `view`, contiguous, zeros, on the host.
  static Tensor zeros_like(const TensorView& view);
  // Uninitialised storage from `allocator` on `device` (the memory a kernel
  // overwrites entirely: no zero-fill, whose page faults cost more than a
  // small kernel). The allocator must outlive the tensor.
  static Tensor empty(DType dtype, std::span<const std::int64_t> shape, Device device, Allocator& allocator);

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: views are how tensors travel
  void* data() const { return view_.data; }
  template <typename T>
  T* as() const { return view_.as<T>(); }
  // 0 for a default-constructed (empty) tensor, which owns no storage; its
  // view's product over no dimensions would be 1 element at a null pointer.
  std::int64_t numel() const { return storage_ ? view_.numel() : 0; }
  bool defined() const { return view_.defined(); }

 private:
  static Tensor allocate(TensorView view);
  std::shared_ptr<void> storage_;
  TensorView view_;
};

}  // namespace attend
