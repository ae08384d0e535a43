// Reading and writing NumPy .npy files.
//
// Supported: format versions 1.0, 2.0 and 3.0; C order only; little-endian
// element types '<f4' (f32), '<f8' (f64), '<f2' (f16) and '<i4' (i32) — the
// native-order spellings '=' and '|' are accepted for the same types on this
// little-endian library. bf16 has no NumPy dtype and cannot be stored. At most
// TensorView::kMaxDims dimensions; a 0-d array becomes a one-element tensor
// with ndim 0. Every failure is an attend::Error with code io (overflow for
// shapes whose byte size does not fit) naming the file and the offending field.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "attend/tensor.h"

namespace attend {

// Reads the whole file and parses it with parse_npy. Only a regular file is
// read: a FIFO, a device or a directory is an io error naming the path.
Tensor read_npy(const std::string& path);

// Parses the bytes of a .npy file. Never reads outside `bytes`; any malformed
// header, unsupported dtype, Fortran order, or a data section whose length is
// not exactly numel * itemsize is an attend::Error. `name` (usually the path)
// prefixes the error's field.
Tensor parse_npy(std::span<const std::byte> bytes, std::string_view name);

// The header NumPy's np.save writes for `t` (magic, version, length, dict,
// padding to a multiple of 64 bytes, newline): version 1.0 unless the dict
// needs more than 65535 bytes.
std::string npy_header(const TensorView& t);

// Writes `t` in C order. Strided views are written row by row; the view itself
// is never modified.
void write_npy(const std::string& path, const TensorView& t);

}  // namespace attend
