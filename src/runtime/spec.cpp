#include "attend/spec.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "attend/error.h"
#include "attend/spec_fields.h"
#include "runtime/checked.h"

namespace attend {

std::string_view to_string(Mode mode) { return mode == Mode::training ? "training" : "inference"; }
std::string_view to_string(Pass pass) { return pass == Pass::backward ? "backward" : "forward"; }

std::string_view to_string(SoftmaxType type) {
  switch (type) {
    case SoftmaxType::vanilla: return "vanilla";
    case SoftmaxType::off_by_one: return "off_by_one";
    case SoftmaxType::learnable: return "learnable";
  }
  return "?";
}

SoftmaxType parse_softmax_type(std::string_view text, std::string_view field) {
  for (SoftmaxType t : {SoftmaxType::vanilla, SoftmaxType::off_by_one, SoftmaxType::learnable}) {
    if (text == to_string(t)) return t;
  }
  throw Error(ErrorCode::invalid_argument, std::string(field), std::string(text),
              "expected vanilla, off_by_one or learnable");
}

std::string_view to_string(KVScale scale) {
  switch (scale) {
    case KVScale::none: return "none";
    case KVScale::per_tensor: return "per_tensor";
    case KVScale::per_head: return "per_head";
    case KVScale::per_token: return "per_token";
  }
  return "?";
}

KVScale parse_kv_scale(std::string_view text, std::string_view field) {
  for (KVScale k : {KVScale::none, KVScale::per_tensor, KVScale::per_head, KVScale::per_token}) {
    if (text == to_string(k)) return k;
  }
  throw Error(ErrorCode::invalid_argument, std::string(field), std::string(text),
              "expected none, per_tensor, per_head or per_token");
}

double AttentionSpec::effective_scale() const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim_qk));
}

namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

[[noreturn]] void invalid(std::string field, std::string value, std::string detail, std::string limit = {}) {
  throw Error(ErrorCode::invalid_argument, std::move(field), std::move(value), std::move(detail), std::move(limit));
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
  if (s.dtype == DType::i32 || is_kv8(s.dtype)) {
    invalid("dtype", std::string(to_string(s.dtype)),
            is_kv8(s.dtype) ? "an 8-bit type is a K/V storage type only: set kv_dtype (q and out stay f32, bf16 or f16)"
                            : "attention tensors must be floating point");
  }
  if (s.kv_dtype && *s.kv_dtype != s.dtype) {
    const bool wide = s.dtype == DType::f32 || s.dtype == DType::bf16 || s.dtype == DType::f16;
    if (!(is_kv8(*s.kv_dtype) && wide)) {
      invalid("kv_dtype", std::string(to_string(*s.kv_dtype)),
              "must equal dtype=" + std::string(to_string(s.dtype)) +
                  ", or be fp8_e4m3, fp8_e5m2 or i8 (an 8-bit KV cache) when dtype is f32, bf16 or f16");
    }
  }
  if (s.kv_scale != KVScale::none && !s.kv_quantized()) {
    invalid("kv_scale", std::string(to_string(s.kv_scale)),
            "scales apply to an 8-bit kv_dtype (fp8_e4m3, fp8_e5m2, i8); kv_dtype is " +
                std::string(to_string(s.effective_kv_dtype())));
  }
  if (s.dq_dtype && *s.dq_dtype != s.dtype) {
    const bool half = s.dtype == DType::bf16 || s.dtype == DType::f16;
    if (!(half && *s.dq_dtype == DType::f32)) {
      invalid("dq_dtype", std::string(to_string(*s.dq_dtype)),
              "must equal dtype=" + std::string(to_string(s.dtype)) + ", or be f32 when dtype is bf16 or f16");
    }
  }
  if (s.out_dtype && *s.out_dtype != s.dtype) {
    const bool half = s.dtype == DType::bf16 || s.dtype == DType::f16;
    if (!(half && *s.out_dtype == DType::f32)) {
      invalid("out_dtype", std::string(to_string(*s.out_dtype)),
              "must equal dtype=" + std::string(to_string(s.dtype)) + ", or be f32 when dtype is bf16 or f16");
    }
  }
  require_at_least(s.q_offset, 0, "q_offset");
  require_at_least(s.kv_offset, 0, "kv_offset");
  // Positions stay far from int64's edge, so masks can subtract them freely.
  constexpr std::int64_t kMaxOffset = std::int64_t{1} << 40;
  if (s.q_offset > kMaxOffset)
    invalid("q_offset", std::to_string(s.q_offset), "must be at most 2^40", std::to_string(kMaxOffset));
  if (s.kv_offset > kMaxOffset)
    invalid("kv_offset", std::to_string(s.kv_offset), "must be at most 2^40", std::to_string(kMaxOffset));
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
  const std::int64_t rows_kv = s.varlen() ? s.total_kv : detail::checked_mul(s.batch, s.seqlen_kv, "kv rows");
  check_bytes({rows_q, s.heads_q, s.head_dim_qk}, s.dtype, "q bytes");
  check_bytes({rows_q, s.heads_q, s.head_dim_v}, s.dtype, "out bytes");
  check_bytes({rows_kv, s.heads_kv, s.head_dim_qk}, s.effective_kv_dtype(), "k bytes");
  check_bytes({rows_kv, s.heads_kv, s.head_dim_v}, s.effective_kv_dtype(), "v bytes");
  if (s.kv_scale == KVScale::per_head) check_bytes({s.batch, s.heads_kv}, DType::f32, "k_scale bytes");
  if (s.kv_scale == KVScale::per_token) check_bytes({rows_kv, s.heads_kv}, DType::f32, "k_scale bytes");
  check_bytes({rows_q, s.heads_q}, DType::f64, "lse bytes");
  if (s.has_bias) check_bytes({s.batch, s.heads_q, s.seqlen_q, s.seqlen_kv}, s.dtype, "bias bytes");
  if (s.varlen() && s.batch == std::numeric_limits<std::int64_t>::max()) {
    invalid("batch", std::to_string(s.batch), "cu_seqlens would need batch+1 entries");
  }
}

std::string signature(const AttentionSpec& s) {
  // Every field that can influence backend choice, by name: a field added to
  // the table is part of the key without touching this function.
  std::string out;
  for (const SpecField& f : spec_fields()) {
    if (f.key == KeyUse::none) continue;
    if (!out.empty()) out += ',';
    out += std::string(f.name) + '=' + get_field(s, f);
  }
  return out;
}

std::string describe(const AttentionSpec& s) {
  std::ostringstream os;
  os << "B=" << s.batch << " Sq=" << s.seqlen_q << " Sk=" << s.seqlen_kv << " H=" << s.heads_q << '/' << s.heads_kv
     << " D=" << s.head_dim_qk << '/' << s.head_dim_v << ' ' << to_string(s.dtype) << ' ' << to_string(s.layout);
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
  if (s.effective_out_dtype() != s.dtype) os << " out=" << to_string(s.effective_out_dtype());
  if (s.has_offsets()) os << " offsets(" << s.q_offset << ',' << s.kv_offset << ')';
  if (s.accumulate_grads) os << " accumulate";
  if (s.has_sink()) os << " sinks=" << to_string(s.softmax_type);
  if (s.effective_kv_dtype() != s.dtype) {
    os << " kv=" << to_string(s.effective_kv_dtype());
    if (s.kv_scale != KVScale::none) os << '/' << to_string(s.kv_scale);
  }
  return os.str();
}

std::string_view to_string(Role role) {
  switch (role) {
    case Role::q: return "q";
    case Role::k: return "k";
    case Role::v: return "v";
    case Role::out: return "out";
    case Role::lse: return "lse";
    case Role::dout: return "dout";
    case Role::dq: return "dq";
    case Role::dk: return "dk";
    case Role::dv: return "dv";
    case Role::bias: return "bias";
    case Role::cu_seqlens_q: return "cu_seqlens_q";
    case Role::cu_seqlens_kv: return "cu_seqlens_kv";
    case Role::sinks: return "sinks";
    case Role::dsinks: return "dsinks";
    case Role::k_scale: return "k_scale";
    case Role::v_scale: return "v_scale";
  }
  return "?";
}

Shape expected_shape(const AttentionSpec& s, Role role) {
  const auto tokens = [&](std::int64_t rows, std::int64_t total, std::int64_t heads, std::int64_t dim) -> Shape {
    switch (s.layout) {
      case Layout::bshd: return {4, {s.batch, rows, heads, dim}};
      case Layout::bhsd: return {4, {s.batch, heads, rows, dim}};
      case Layout::sbhd: return {4, {rows, s.batch, heads, dim}};
      case Layout::thd: return {3, {total, heads, dim}};
    }
    return {};
  };
  const auto keys = [&](std::int64_t dim) -> Shape {
    if (s.paged()) return {4, {-1, s.kv_page_size, s.heads_kv, dim}};
    return tokens(s.seqlen_kv, s.total_kv, s.heads_kv, dim);
  };
  switch (role) {
    case Role::q:
    case Role::dq: return tokens(s.seqlen_q, s.total_q, s.heads_q, s.head_dim_qk);
    case Role::out:
    case Role::dout: return tokens(s.seqlen_q, s.total_q, s.heads_q, s.head_dim_v);
    case Role::k:
    case Role::dk: return keys(s.head_dim_qk);
    case Role::v:
    case Role::dv: return keys(s.head_dim_v);
    case Role::lse: return s.varlen() ? Shape{2, {s.heads_q, s.total_q}} : Shape{3, {s.batch, s.heads_q, s.seqlen_q}};
    case Role::bias: return {4, {s.batch, s.heads_q, s.seqlen_q, s.seqlen_kv}};
    case Role::cu_seqlens_q:
    case Role::cu_seqlens_kv: return {1, {s.batch + 1}};
    case Role::sinks:
    case Role::dsinks: return {1, {s.heads_q}};
    case Role::k_scale:
    case Role::v_scale: {
      switch (s.kv_scale) {
        case KVScale::none: return {1, {0}};
        case KVScale::per_tensor: return {1, {1}};
        case KVScale::per_head: return {2, {s.batch, s.heads_kv}};
        case KVScale::per_token: {
          Shape k = keys(1);  // k's shape with a last dim of 1, which is then dropped
          --k.ndim;
          return k;
        }
      }
      return {};
    }
  }
  return {};
}

DType expected_dtype(const AttentionSpec& s, Role role) {
  switch (role) {
    case Role::dq: return s.effective_dq_dtype();
    case Role::out:
    case Role::dout: return s.effective_out_dtype();
    case Role::lse:
    case Role::sinks:
    case Role::dsinks: return s.lse_dtype();
    case Role::cu_seqlens_q:
    case Role::cu_seqlens_kv: return DType::i32;
    case Role::k:
    case Role::v: return s.effective_kv_dtype();
    case Role::k_scale:
    case Role::v_scale: return DType::f32;
    default: return s.dtype;
  }
}

}  // namespace attend
