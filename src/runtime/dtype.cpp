#include "attend/dtype.h"

#include <string>

#include "attend/error.h"

namespace attend {

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
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
  }
  return "?";
}

DType parse_dtype(std::string_view text, std::string_view field) {
  if (text == "f32" || text == "float32") return DType::f32;
  if (text == "f64" || text == "float64") return DType::f64;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  if (text == "f16" || text == "float16") return DType::f16;
  if (text == "i32" || text == "int32") return DType::i32;
  throw Error(ErrorCode::invalid_argument, std::string(field), std::string(text),
              "unknown dtype; expected one of f32, f64, bf16, f16, i32");
}

}  // namespace attend
