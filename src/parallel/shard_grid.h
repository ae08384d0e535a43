// Row/head blocks of sharded tensors, for packing what the CP engines send.
//
// Every tensor a CP engine moves is (batch, rows, heads, features) with the
// features contiguous: q/k/v/out/dq/... in bshd, and an LSE (B, H, S) seen as
// (B, S, H, 1). A Grid addresses one such tensor by strides, so a chunk of rows
// or a slice of heads is copied without caring who owns the memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attend/dtype.h"
#include "attend/error.h"
#include "attend/tensor.h"
#include "kernel/half.h"

namespace attend::parallel::detail {

struct Grid {
  std::byte* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t n[4] = {};   // batch, rows, heads, features
  std::int64_t st[4] = {};  // strides in elements (st[3] == 1)

  std::byte* at(std::int64_t b, std::int64_t s, std::int64_t h) const {
    return data + (b * st[0] + s * st[1] + h * st[2]) * static_cast<std::int64_t>(size_of(dtype));
  }
};

// A bshd tensor as a Grid.
inline Grid grid(const TensorView& t) {
  Grid g{static_cast<std::byte*>(t.data), t.dtype, {}, {}};
  for (int d = 0; d < 4; ++d) {
    g.n[d] = t.shape[d];
    g.st[d] = t.strides[d];
  }
  return g;
}

// A (B, H, S) LSE as a (B, S, H, 1) Grid.
inline Grid lse_grid(const TensorView& t) {
  return Grid{static_cast<std::byte*>(t.data),
              t.dtype,
              {t.shape[0], t.shape[2], t.shape[1], 1},
              {t.strides[0], t.strides[2], t.strides[1], 1}};
}

// Rows [row0, row0 + rows) of a bshd view.
inline TensorView row_view(const TensorView& t, std::int64_t row0, std::int64_t rows) {
  TensorView v = t;
  v.data = static_cast<std::byte*>(t.data) + row0 * t.strides[1] * static_cast<std::int64_t>(size_of(t.dtype));
  v.shape[1] = rows;
  return v;
}

// Rows of a (B, H, S) LSE.
inline TensorView lse_row_view(const TensorView& t, std::int64_t row0, std::int64_t rows) {
  TensorView v = t;
  v.data = static_cast<std::byte*>(t.data) + row0 * t.strides[2] * static_cast<std::int64_t>(size_of(t.dtype));
  v.shape[2] = rows;
  return v;
}

// A contiguous Grid of (B, S, H, D) over `data`.
inline Grid packed(std::byte* data, DType dtype, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  return Grid{data, dtype, {b, s, h, d}, {s * h * d, h * d, d, 1}};
}

// dst[:, ds:ds+rows, dh:dh+heads, :] = src[:, ss:ss+rows, sh:sh+heads, :] (same dtype).
inline void copy_block(const Grid& src, std::int64_t ss, std::int64_t sh, const Grid& dst, std::int64_t ds,
                       std::int64_t dh, std::int64_t rows, std::int64_t heads) {
  const std::size_t bytes = static_cast<std::size_t>(src.n[3]) * size_of(src.dtype);
  for (std::int64_t b = 0; b < src.n[0]; ++b) {
    for (std::int64_t s = 0; s < rows; ++s) {
      for (std::int64_t h = 0; h < heads; ++h) std::memcpy(dst.at(b, ds + s, dh + h), src.at(b, ss + s, sh + h), bytes);
    }
  }
}

inline double load(const std::byte* p, DType dtype) {
  switch (dtype) {
    case DType::f64: {
      double x;
      std::memcpy(&x, p, sizeof x);
      return x;
    }
    case DType::f32: {
      float x;
      std::memcpy(&x, p, sizeof x);
      return x;
    }
    case DType::bf16: {
      std::uint16_t x;
      std::memcpy(&x, p, sizeof x);
      return attend::detail::bf16_bits_to_f32(x);
    }
    case DType::f16: {
      std::uint16_t x;
      std::memcpy(&x, p, sizeof x);
      return attend::detail::f16_bits_to_f32(x);
    }
    default: break;
  }
  throw Error(ErrorCode::invalid_argument, "dtype", std::string(to_string(dtype)), "not a floating dtype");
}

inline void store(std::byte* p, DType dtype, double x) {
  switch (dtype) {
    case DType::f64: std::memcpy(p, &x, sizeof x); return;
    case DType::f32: {
      const auto f = static_cast<float>(x);
      std::memcpy(p, &f, sizeof f);
      return;
    }
    case DType::bf16: {
      const auto h = attend::detail::f32_to_bf16_bits(static_cast<float>(x));
      std::memcpy(p, &h, sizeof h);
      return;
    }
    case DType::f16: {
      const auto h = attend::detail::f32_to_f16_bits(static_cast<float>(x));
      std::memcpy(p, &h, sizeof h);
      return;
    }
    default: break;
  }
  throw Error(ErrorCode::invalid_argument, "dtype", std::string(to_string(dtype)), "not a floating dtype");
}

// dst = src (add: dst += src) element by element, converting dtypes (rounded once).
inline void convert_grid(const Grid& src, const Grid& dst, bool add) {
  const std::size_t es = size_of(src.dtype), ed = size_of(dst.dtype);
  for (std::int64_t b = 0; b < src.n[0]; ++b) {
    for (std::int64_t s = 0; s < src.n[1]; ++s) {
      for (std::int64_t h = 0; h < src.n[2]; ++h) {
        const std::byte* ps = src.at(b, s, h);
        std::byte* pd = dst.at(b, s, h);
        for (std::int64_t d = 0; d < src.n[3]; ++d) {
          const double x = load(ps + static_cast<std::size_t>(d) * es, src.dtype);
          std::byte* q = pd + static_cast<std::size_t>(d) * ed;
          store(q, dst.dtype, add ? load(q, dst.dtype) + x : x);
        }
      }
    }
  }
}

}  // namespace attend::parallel::detail
