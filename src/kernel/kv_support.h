// What a backend says of an 8-bit K/V (AttentionSpec::kv_dtype), per pass: the
// one rule every backend's check states, so that no backend can take an 8-bit
// cache by accident (its dtype checks look at spec.dtype, the queries').
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "attend/backend.h"
#include "attend/spec.h"

namespace attend::detail {

// `forward_kernels`: the backend's forward reads 8-bit K/V (dequantizing in
// registers). Backward is refused for every backend: a quantized cache is an
// inference input with no gradient (Mode::training never selects it).
inline void require_kv_dtype(const AttentionSpec& s, Pass pass, std::string_view backend, bool forward_kernels,
                             Support& sup) {
  if (!s.kv_quantized()) return;
  const std::string kv(to_string(s.effective_kv_dtype()));
  if (pass == Pass::backward) {
    sup.require(false, ReasonCode::kv_dtype, [&] {
      return "kv_dtype=" + kv + ": an 8-bit K/V cache is forward only (no gradient flows into quantized codes)";
    });
    return;
  }
  sup.require(forward_kernels, ReasonCode::kv_dtype, [&] {
    return "kv_dtype=" + kv + " is not read by " + std::string(backend) +
           " (8-bit K/V: the CPU backends decode and flash)";
  });
}

// A kernel family's forward kernels over an 8-bit K/V:
// [q/out dtype: f32, bf16, f16][kv dtype: fp8_e4m3, fp8_e5m2, i8].
template <class Kernels>
using Kv8Kernels = std::array<std::array<Kernels, 3>, 3>;

template <class Kernels>
const Kernels& kv8_kernels(const Kv8Kernels<Kernels>& table, DType dtype, DType kv_dtype) {
  const std::size_t q = dtype == DType::bf16 ? 1 : dtype == DType::f16 ? 2 : 0;
  const std::size_t kv = kv_dtype == DType::fp8_e4m3 ? 0 : kv_dtype == DType::fp8_e5m2 ? 1 : 2;
  return table[q][kv];
}

}  // namespace attend::detail
