#include "attend/spec.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "attend/error.h"
#include "core/checked.h"

namespace attend {

std::string_view to_string(Mode mode) { return mode == Mode::training ? "training" : "inference"; }
std::string_view to_string(Pass pass) { return pass == Pass::backward ? "backward" : "forward"; }

double AttentionSpec::effective_scale() const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim_qk));
}

namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

[[noreturn]] void invalid(std::string field, std::string value, std::string detail,
                          std::string limit = {}) {
  throw Error(ErrorCode::invalid_argument, std::move(field), std::move(value), std::move(detail),
              std::move(limit));
}

void require_at_least(std::int64_t value, std::int64_t minimum, const char* field) {
  if (value < minimum) {
    invalid(field, std::to_string(value), "must be at least " + std::to_string(minimum));
  }
}

// Byte size of a tensor of `dims`, checked end to end.
void check_bytes(std::initializer_list<std::int64_t> dims, DType dtype, const char* what) {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n = detail::checked_mul(n, d, what);
  (void)detail::checked_bytes(n, size_of(dtype), what);
}

}  // namespace

void validate(const AttentionSpec& s) {
  require_at_least(s.batch, 1, "batch");
  require_at_least(s.seqlen_q, 0, "seqlen_q");
  require_at_least(s.seqlen_kv, 0, "seqlen_kv");
  require_at_least(s.heads_q, 1, "heads_q");
  require_at_least(s.heads_kv, 1, "heads_kv");
  require_at_least(s.head_dim_qk, 1, "head_dim_qk");
  require_at_least(s.head_dim_v, 1, "head_dim_v");
  if (s.heads_q % s.heads_kv != 0) {
    invalid("heads_kv", std::to_string(s.heads_kv),
            "heads_q=" + std::to_string(s.heads_q) + " is not a multiple of heads_kv");
  }
  if (s.dtype == DType::i32) invalid("dtype", "i32", "attention tensors must be floating point");
  if (s.dq_dtype && *s.dq_dtype != s.dtype) {
    const bool half = s.dtype == DType::bf16 || s.dtype == DType::f16;
    if (!(half && *s.dq_dtype == DType::f32)) {
      invalid("dq_dtype", std::string(to_string(*s.dq_dtype)),
              "must equal dtype=" + std::string(to_string(s.dtype)) + ", or be f32 when dtype is bf16 or f16");
    }
  }
  if (s.varlen()) {
    require_at_least(s.total_q, 0, "total_q");
    require_at_least(s.total_kv, 0, "total_kv");
  }
  if (s.scale && !std::isfinite(*s.scale)) invalid("scale", num(*s.scale), "must be finite");
  if (!std::isfinite(s.softcap) || s.softcap < 0) {
    invalid("softcap", num(s.softcap), "must be finite and >= 0 (0 disables softcap)");
  }
  if (s.window_left < -1) {
    invalid("window_left", std::to_string(s.window_left),
            "must be >= -1 (-1 = unbounded; FlashAttention treats any negative value as unbounded; pass -1)");
  }
  if (s.window_right < -1) {
    invalid("window_right", std::to_string(s.window_right),
            "must be >= -1 (-1 = unbounded; FlashAttention treats any negative value as unbounded; pass -1)");
  }
  if (!(s.dropout_p >= 0.0 && s.dropout_p < 1.0)) {
    invalid("dropout_p", num(s.dropout_p), "must lie in [0, 1)");
  }
  if (s.bias_requires_grad && !s.has_bias) {
    invalid("bias_requires_grad", "true", "requires has_bias");
  }
  require_at_least(s.kv_page_size, 0, "kv_page_size");
  if (s.paged() && s.varlen()) {
    invalid("kv_page_size", std::to_string(s.kv_page_size),
            "a paged K/V cache needs dense queries (layout bshd, bhsd or sbhd), not thd");
  }
  if (s.kv_leftpad && !s.paged()) invalid("kv_leftpad", "true", "requires a paged K/V cache (kv_page_size > 0)");

  // Every tensor the spec implies must have a representable byte size.
  const std::int64_t rows_q = s.varlen() ? s.total_q : detail::checked_mul(s.batch, s.seqlen_q, "q rows");
  const std::int64_t rows_kv =
      s.varlen() ? s.total_kv : detail::checked_mul(s.batch, s.seqlen_kv, "kv rows");
  check_bytes({rows_q, s.heads_q, s.head_dim_qk}, s.dtype, "q bytes");
  check_bytes({rows_q, s.heads_q, s.head_dim_v}, s.dtype, "out bytes");
  check_bytes({rows_kv, s.heads_kv, s.head_dim_qk}, s.dtype, "k bytes");
  check_bytes({rows_kv, s.heads_kv, s.head_dim_v}, s.dtype, "v bytes");
  check_bytes({rows_q, s.heads_q}, DType::f64, "lse bytes");
  if (s.has_bias) check_bytes({s.batch, s.heads_q, s.seqlen_q, s.seqlen_kv}, s.dtype, "bias bytes");
  if (s.varlen() && s.batch == std::numeric_limits<std::int64_t>::max()) {
    invalid("batch", std::to_string(s.batch), "cu_seqlens would need batch+1 entries");
  }
}

std::string signature(const AttentionSpec& s) {
  std::ostringstream os;
  os << s.batch << ',' << s.seqlen_q << ',' << s.seqlen_kv << ',' << s.heads_q << ','
     << s.heads_kv << ',' << s.head_dim_qk << ',' << s.head_dim_v << ',' << s.total_q << ','
     << s.total_kv << ',' << to_string(s.dtype) << ',' << to_string(s.layout) << ','
     << (s.scale ? num(*s.scale) : "-") << ',' << num(s.softcap) << ',' << s.alibi << s.has_bias
     << s.bias_requires_grad << s.causal << ',' << s.window_left << ',' << s.window_right << ','
     << num(s.dropout_p) << ',' << s.need_lse << s.deterministic << ',' << s.kv_page_size
     << s.kv_leftpad << ',' << to_string(s.effective_dq_dtype());
  // The dropout seed changes data, never capability: it is not part of the key.
  return os.str();
}

std::string describe(const AttentionSpec& s) {
  std::ostringstream os;
  os << "B=" << s.batch << " Sq=" << s.seqlen_q << " Sk=" << s.seqlen_kv << " H=" << s.heads_q
     << '/' << s.heads_kv << " D=" << s.head_dim_qk << '/' << s.head_dim_v << ' '
     << to_string(s.dtype) << ' ' << to_string(s.layout);
  if (s.varlen()) os << " varlen(total " << s.total_q << '/' << s.total_kv << ')';
  if (s.causal) os << " causal";
  if (s.window_left >= 0 || (!s.causal && s.window_right >= 0)) {
    os << " window(" << s.window_left << ',' << s.effective_window_right() << ')';
  }
  if (s.scale) os << " scale=" << num(*s.scale);
  if (s.softcap > 0) os << " softcap=" << num(s.softcap);
  if (s.alibi) os << " alibi";
  if (s.has_bias) os << (s.bias_requires_grad ? " bias(grad)" : " bias");
  if (s.dropout_p > 0) os << " dropout=" << num(s.dropout_p);
  if (s.deterministic) os << " deterministic";
  if (s.effective_dq_dtype() != s.dtype) os << " dq=" << to_string(s.effective_dq_dtype());
  if (s.paged()) os << " paged(" << s.kv_page_size << (s.kv_leftpad ? ",leftpad)" : ")");
  return os.str();
}

}  // namespace attend
