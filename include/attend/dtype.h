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
enum class DType : std::uint8_t { f32, f64, bf16, f16, i32 };

std::size_t size_of(DType dtype);
std::string_view to_string(DType dtype);
// Parses "f32"/"float32", "f64"/"float64", "bf16"/"bfloat16", "f16"/"float16", "i32"/"int32";
// throws attend::Error naming `field` otherwise.
DType parse_dtype(std::string_view text, std::string_view field = "dtype");

}  // namespace attend
