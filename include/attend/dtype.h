// Element types attend can store and exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace attend {

// f32, f64, bf16 and f16 are element types of q/k/v/out and the gradients
// (which backend computes which, per pass, is each backend's check()). bf16 and
// f16 are stored as 2-byte values and computed with f32 accumulation; their LSE
// is f32. i32 is for index tensors (cu_seqlens, block tables).
//
// fp8_e4m3, fp8_e5m2 and i8 are storage types of a quantized KV cache only
// (AttentionSpec::kv_dtype): 8-bit codes that stand for code * scale, the
// scale coming from Inputs::k_scale / v_scale (AttentionSpec::kv_scale says
// how the scales are laid out). fp8_e4m3 is OCP's E4M3 "fn" (bias 7, no
// infinities, largest finite 448, one NaN code per sign: S.1111.111, PyTorch's
// float8_e4m3fn); fp8_e5m2 is OCP's E5M2 (bias 15, IEEE-like: the upper byte
// of an f16, largest finite 57344; PyTorch's float8_e5m2); i8 is a signed
// two's complement integer, used symmetrically in [-127, 127].
enum class DType : std::uint8_t { f32, f64, bf16, f16, i32, fp8_e4m3, fp8_e5m2, i8 };

// An 8-bit quantized K/V storage type (fp8_e4m3, fp8_e5m2, i8).
constexpr bool is_kv8(DType dtype) {
  return dtype == DType::fp8_e4m3 || dtype == DType::fp8_e5m2 || dtype == DType::i8;
}

std::size_t size_of(DType dtype);

// The value of one 8-bit code of `dtype` (fp8_e4m3, fp8_e5m2, i8), exact; and
// the code of x, rounded to nearest even and saturated at the largest finite
// code (±448, ±57344, ±127; NaN stays NaN in fp8, 0 in i8). Throws
// attend::Error naming `dtype` for any other type.
float kv8_value(DType dtype, std::uint8_t code);
std::uint8_t kv8_code(DType dtype, float x);
std::string_view to_string(DType dtype);
// Parses "f32"/"float32", "f64"/"float64", "bf16"/"bfloat16", "f16"/"float16", "i32"/"int32",
// "fp8_e4m3"/"float8_e4m3fn", "fp8_e5m2"/"float8_e5m2", "i8"/"int8";
// throws attend::Error naming `field` otherwise.
DType parse_dtype(std::string_view text, std::string_view field = "dtype");

}  // namespace attend
