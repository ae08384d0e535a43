// attend::merge: partial outputs combined exactly through their LSEs.
#include "attend/merge.h"

#include <string>
#include <vector>

#include "attend/error.h"
#include "kernel/half.h"
#include "kernel/layout.h"
#include "kernel/lse_merge.h"

namespace attend {

namespace {

void require(bool ok, const std::string& field, const std::string& value, const std::string& detail) {
  if (!ok) throw Error(ErrorCode::shape_mismatch, field, value, detail);
}

void check_tensor(const std::string& name, const TensorView& t, const Shape& want, bool any_float, DType dtype) {
  if (!t.defined()) throw Error(ErrorCode::invalid_argument, name, "undefined", "tensor is required");
  require(t.device.is_host(), name + ".device", to_string(t.device), "merge runs on host memory");
  if (any_float) {
    require(t.dtype != DType::i32, name + ".dtype", std::string(to_string(t.dtype)), "expected a floating dtype");
  } else {
    require(t.dtype == dtype, name + ".dtype", std::string(to_string(t.dtype)),
            "expected " + std::string(to_string(dtype)));
  }
  bool same = t.ndim == want.ndim;
  for (int d = 0; same && d < want.ndim; ++d) same = t.shape[d] == want.dims[d];
  std::string w = "(";
  for (int d = 0; d < want.ndim; ++d) w += (d ? ", " : "") + std::to_string(want.dims[d]);
  require(same, name + ".shape", t.shape_string(), "expected " + w + ")");
  require(t.data != nullptr || t.numel() == 0, name + ".data", "null", "null pointer");
  for (int d = 0; d < t.ndim; ++d) {
    require(t.strides[d] >= 0, name + ".strides[" + std::to_string(d) + "]", std::to_string(t.strides[d]),
            "strides must be non-negative");
  }
}

double load(const TensorView& t, std::int64_t offset) {
  switch (t.dtype) {
    case DType::f32: return t.as<const float>()[offset];
    case DType::f64: return t.as<const double>()[offset];
    case DType::bf16: return detail::to_f32(t.as<const detail::bf16_t>()[offset]);
    case DType::f16: return detail::to_f32(t.as<const detail::f16_t>()[offset]);
    case DType::i32:
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
    case DType::i8: break;  // not an output dtype (validate refuses it)
  }
  return 0.0;
}

void store(const TensorView& t, std::int64_t offset, double v) {
  switch (t.dtype) {
    case DType::f32: t.as<float>()[offset] = static_cast<float>(v); return;
    case DType::f64: t.as<double>()[offset] = v; return;
    case DType::bf16: t.as<detail::bf16_t>()[offset] = detail::from_f32<detail::bf16_t>(static_cast<float>(v)); return;
    case DType::f16: t.as<detail::f16_t>()[offset] = detail::from_f32<detail::f16_t>(static_cast<float>(v)); return;
    case DType::i32:
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
    case DType::i8: return;
  }
}

}  // namespace

void merge(const AttentionSpec& spec, std::span<const Partial> parts, const TensorView& out, const TensorView& lse) {
  validate(spec);
  if (parts.empty()) throw Error(ErrorCode::invalid_argument, "parts", "0", "merge needs at least one partial result");
  const Shape out_shape = expected_shape(spec, Role::out), lse_shape = expected_shape(spec, Role::lse);
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const std::string n = "parts[" + std::to_string(p) + "]";
    check_tensor(n + ".out", parts[p].out, out_shape, true, DType::f32);
    check_tensor(n + ".lse", parts[p].lse, lse_shape, false, spec.lse_dtype());
  }
  check_tensor("out", out, out_shape, true, DType::f32);
  check_tensor("lse", lse, lse_shape, false, spec.lse_dtype());

  const Layout layout = spec.layout;
  const std::int64_t n = static_cast<std::int64_t>(parts.size()), dv = spec.head_dim_v;
  const std::int64_t rows = spec.varlen() ? spec.total_q : spec.seqlen_q;
  const std::int64_t batches = spec.varlen() ? 1 : spec.batch;
  std::vector<detail::TokenStrides> so(parts.size()), sl(parts.size());
  for (std::size_t p = 0; p < parts.size(); ++p) {
    so[p] = detail::token_strides(parts[p].out, layout);
    sl[p] = detail::lse_strides(parts[p].lse, layout);
  }
  const detail::TokenStrides dso = detail::token_strides(out, layout), dsl = detail::lse_strides(lse, layout);
  std::vector<double> acc(static_cast<std::size_t>(dv));
  // Row by row, every part read before the row is written: out and lse may be a part's own tensors.
  for (std::int64_t b = 0; b < batches; ++b) {
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t h = 0; h < spec.heads_q; ++h) {
        const auto lse_of = [&](std::int64_t p) { return load(parts[p].lse, sl[p].offset(b, i, h)); };
        const double total = detail::merged_lse<double>(n, lse_of);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (std::int64_t p = 0; p < n; ++p) {
          const double wp = detail::merge_weight(lse_of(p), total);
          if (wp == 0.0) continue;  // an empty part: its out is not read (0 * garbage)
          const std::int64_t base = so[p].offset(b, i, h);
          for (std::int64_t d = 0; d < dv; ++d) acc[d] += wp * load(parts[p].out, base + d);
        }
        const std::int64_t dst = dso.offset(b, i, h);
        for (std::int64_t d = 0; d < dv; ++d) store(out, dst + d, acc[d]);
        store(lse, dsl.offset(b, i, h), total);
      }
    }
  }
}

}  // namespace attend
