#include "attend/dtype.h"

#include <string>

#include "attend/error.h"
#include "kernel/quant8.h"

namespace attend {

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
    case DType::i8: return 1;
  }
  return 0;
}

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp8_e5m2: return "fp8_e5m2";
    case DType::i8: return "i8";
  }
  return "?";
}

namespace {
[[noreturn]] void not_kv8(DType dtype) {
  throw Error(ErrorCode::invalid_argument, "dtype", std::string(to_string(dtype)),
              "not an 8-bit K/V type (fp8_e4m3, fp8_e5m2, i8)");
}
}  // namespace

float kv8_value(DType dtype, std::uint8_t code) {
  switch (dtype) {
    case DType::fp8_e4m3: return detail::fp8_e4m3_bits_to_f32(code);
    case DType::fp8_e5m2: return detail::fp8_e5m2_bits_to_f32(code);
    case DType::i8: return static_cast<float>(static_cast<std::int8_t>(code));
    default: not_kv8(dtype);
  }
}

std::uint8_t kv8_code(DType dtype, float x) {
  switch (dtype) {
    case DType::fp8_e4m3: return detail::f32_to_fp8_e4m3_bits(x);
    case DType::fp8_e5m2: return detail::f32_to_fp8_e5m2_bits(x);
    case DType::i8: return static_cast<std::uint8_t>(detail::f32_to_i8(x));
    default: not_kv8(dtype);
  }
}

DType parse_dtype(std::string_view text, std::string_view field) {
  if (text == "f32" || text == "float32") return DType::f32;
  if (text == "f64" || text == "float64") return DType::f64;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  if (text == "f16" || text == "float16") return DType::f16;
  if (text == "i32" || text == "int32") return DType::i32;
  if (text == "fp8_e4m3" || text == "float8_e4m3fn") return DType::fp8_e4m3;
  if (text == "fp8_e5m2" || text == "float8_e5m2") return DType::fp8_e5m2;
  if (text == "i8" || text == "int8") return DType::i8;
  throw Error(ErrorCode::invalid_argument, std::string(field), std::string(text),
              "unknown dtype; expected one of f32, f64, bf16, f16, i32, fp8_e4m3, fp8_e5m2, i8");
}

}  // namespace attend
