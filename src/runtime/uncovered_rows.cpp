#include "runtime/uncovered_rows.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace attend::detail {
namespace {

// cu[B]: validated before the kernel ran (0 <= cu[B] <= total).
std::int64_t covered(const TensorView& cu, std::int64_t batch) {
  return cu.as<const std::int32_t>()[batch * cu.strides[0]];
}

// Zeros rows [from, rows) of a (rows, H, D) view whose last dim is contiguous
// (all-zero bytes are 0 in every float type attend has).
void zero_rows(const TensorView& t, std::int64_t from) {
  if (!t.defined() || t.ndim != 3) return;
  const std::size_t elem = size_of(t.dtype);
  const std::size_t row_bytes = static_cast<std::size_t>(t.shape[2]) * elem;
  auto* base = static_cast<std::byte*>(t.data);
  for (std::int64_t r = from; r < t.shape[0]; ++r) {
    for (std::int64_t h = 0; h < t.shape[1]; ++h) {
      const std::int64_t offset = r * t.strides[0] + h * t.strides[1];
      std::memset(base + offset * static_cast<std::int64_t>(elem), 0, row_bytes);
    }
  }
}

template <typename T>
void fill_lse(const TensorView& lse, std::int64_t from) {
  auto* p = lse.as<T>();
  for (std::int64_t h = 0; h < lse.shape[0]; ++h) {
    for (std::int64_t t = from; t < lse.shape[1]; ++t) {
      p[h * lse.strides[0] + t * lse.strides[1]] = -std::numeric_limits<T>::infinity();
    }
  }
}

bool applies(const AttentionSpec& s, const Inputs& in) {
  return s.varlen() && in.q.device.is_host() && in.cu_seqlens_q.defined() && in.cu_seqlens_kv.defined();
}

}  // namespace

void define_uncovered_rows(const ForwardArgs& a) {
  if (!applies(a.spec, a.in)) return;
  const std::int64_t end_q = covered(a.in.cu_seqlens_q, a.spec.batch);
  if (end_q >= a.spec.total_q) return;
  zero_rows(a.out, end_q);
  if (a.lse.defined() && a.lse.ndim == 2) {
    if (a.lse.dtype == DType::f64) {
      fill_lse<double>(a.lse, end_q);
    } else {
      fill_lse<float>(a.lse, end_q);
    }
  }
}

void define_uncovered_rows(const BackwardArgs& a) {
  if (!applies(a.spec, a.in) || a.spec.accumulate_grads) return;
  zero_rows(a.dq, covered(a.in.cu_seqlens_q, a.spec.batch));
  // Paged pools are indexed by page, not by packed token: no rows to define.
  if (a.spec.paged()) return;
  const std::int64_t end_kv = covered(a.in.cu_seqlens_kv, a.spec.batch);
  zero_rows(a.dk, end_kv);
  zero_rows(a.dv, end_kv);
}

}  // namespace attend::detail
