// The AttentionSpec field table and the generic operations over it.
#include "attend/spec_fields.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>

#include "attend/error.h"

namespace attend {

namespace {

using S = AttentionSpec;

// Declaration order of AttentionSpec; tests/runtime/test_spec_fields.cpp
// checks that every field is listed (by the struct's size and a round trip).
constexpr SpecField kFields[] = {
    {"batch", &S::batch, KeyUse::exact, "number of sequences (B); varlen: entries of cu_seqlens - 1"},
    {"seqlen_q", &S::seqlen_q, KeyUse::exact, "queries per sequence; varlen: the maximum"},
    {"seqlen_kv", &S::seqlen_kv, KeyUse::bucket, "keys per sequence; varlen and paged: the maximum"},
    {"heads_q", &S::heads_q, KeyUse::exact, "query heads (H)"},
    {"heads_kv", &S::heads_kv, KeyUse::exact, "key/value heads; H % heads_kv == 0 (GQA, MQA)"},
    {"head_dim_qk", &S::head_dim_qk, KeyUse::exact, "feature size of q and k"},
    {"head_dim_v", &S::head_dim_v, KeyUse::exact, "feature size of v and out"},
    {"total_q", &S::total_q, KeyUse::bucket, "varlen: packed query tokens (first dim of thd q)"},
    {"total_kv", &S::total_kv, KeyUse::bucket, "varlen: packed key tokens (first dim of thd k/v)"},
    {"dtype", &S::dtype, KeyUse::exact, "element type of q, k, v, out, bias and gradients"},
    {"dq_dtype", &S::dq_dtype, KeyUse::exact, "dtype of dq; unset: dtype (f32 allowed for bf16/f16)"},
    {"out_dtype", &S::out_dtype, KeyUse::exact, "dtype of out and dout; unset: dtype (f32 allowed for bf16/f16)"},
    {"layout", &S::layout, KeyUse::exact, "bshd, bhsd, sbhd, or thd (varlen)"},
    {"kv_dtype", &S::kv_dtype, KeyUse::exact,
     "dtype of k and v; unset: dtype (fp8_e4m3, fp8_e5m2, i8: an 8-bit KV cache, forward only)"},
    {"kv_scale", &S::kv_scale, KeyUse::exact,
     "scales of 8-bit k/v (code * scale): none, per_tensor, per_head (B,Hkv) or per_token"},
    {"scale", &S::scale, KeyUse::exact, "multiplies q.k; unset: 1/sqrt(head_dim_qk)"},
    {"softcap", &S::softcap, KeyUse::exact, "> 0: logits become softcap*tanh(s/softcap); 0 disables"},
    {"alibi", &S::alibi, KeyUse::exact, "add -slope*|distance| (slopes f32, (H) or (B,H))"},
    {"has_bias", &S::has_bias, KeyUse::exact, "additive bias (1|B, 1|H, Sq, Sk)"},
    {"bias_requires_grad", &S::bias_requires_grad, KeyUse::exact, "training also computes dbias"},
    {"softmax_type", &S::softmax_type, KeyUse::exact,
     "vanilla, off_by_one (sink logit 0) or learnable (sink logits (H) f32, with gradient)"},
    {"causal", &S::causal, KeyUse::exact, "bottom-right aligned causal mask (forces window_right = 0)"},
    {"window_left", &S::window_left, KeyUse::exact, "keys at most this far left of the diagonal; -1 unbounded"},
    {"window_right", &S::window_right, KeyUse::exact, "keys at most this far right of the diagonal; -1 unbounded"},
    {"q_offset", &S::q_offset, KeyUse::exact, "position of query row 0 in the whole sequence (partial problems)"},
    {"kv_offset", &S::kv_offset, KeyUse::exact, "position of key 0 in the whole sequence (partial problems)"},
    {"dropout_p", &S::dropout_p, KeyUse::exact, "dropout probability in [0, 1)"},
    {"dropout_seed", &S::dropout_seed, KeyUse::none, "seed of the Philox dropout mask"},
    {"need_lse", &S::need_lse, KeyUse::exact, "write the log-sum-exp of each row"},
    {"deterministic", &S::deterministic, KeyUse::exact, "backward bitwise identical across thread counts"},
    {"accumulate_grads", &S::accumulate_grads, KeyUse::exact, "backward adds into dq/dk/dv instead of writing"},
    {"kv_page_size", &S::kv_page_size, KeyUse::exact, "> 0: k/v are page pools of this many tokens (KV cache)"},
    {"kv_leftpad", &S::kv_leftpad, KeyUse::exact, "paged: cache_leftpad gives each sequence's first key"},
};

std::string real(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

[[noreturn]] void bad(const SpecField& f, std::string_view text, const char* expected) {
  throw Error(ErrorCode::invalid_argument, std::string(f.name), std::string(text), std::string("expected ") + expected);
}

template <class T>
T parse_number(const SpecField& f, std::string_view text) {
  T v{};
  const char* end = text.data() + text.size();
  std::from_chars_result r{};
  if constexpr (std::is_floating_point_v<T>) {
    // strtod accepts what from_chars does plus forms like "1e3" on every libstdc++.
    std::string s(text);
    char* e = nullptr;
    v = std::strtod(s.c_str(), &e);
    if (s.empty() || e != s.c_str() + s.size()) bad(f, text, "a number");
    return v;
  } else {
    r = std::from_chars(text.data(), end, v);
    if (r.ec == std::errc::result_out_of_range && r.ptr == end) {
      throw Error(ErrorCode::invalid_argument, std::string(f.name), std::string(text),
                  std::is_signed_v<T> ? "does not fit in int64" : "does not fit in uint64");
    }
    if (text.empty() || r.ec != std::errc() || r.ptr != end) {
      bad(f, text, std::is_signed_v<T> ? "an integer" : "a non-negative integer");
    }
    return v;
  }
}

bool parse_bool(const SpecField& f, std::string_view text) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  bad(f, text, "true or false");
}

}  // namespace

std::span<const SpecField> spec_fields() { return kFields; }

std::string_view to_string(FieldKind kind) {
  switch (kind) {
    case FieldKind::integer: return "int";
    case FieldKind::unsigned_integer: return "uint";
    case FieldKind::real: return "real";
    case FieldKind::boolean: return "bool";
    case FieldKind::dtype: return "dtype";
    case FieldKind::layout: return "layout";
    case FieldKind::softmax_type: return "softmax_type";
    case FieldKind::kv_scale: return "kv_scale";
  }
  return "?";
}

FieldKind field_kind(const SpecField& field) {
  return std::visit(
      [](auto member) {
        using T = std::decay_t<decltype(std::declval<AttentionSpec&>().*member)>;
        if constexpr (std::is_same_v<T, bool>)
          return FieldKind::boolean;
        else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::optional<double>>)
          return FieldKind::real;
        else if constexpr (std::is_same_v<T, DType> || std::is_same_v<T, std::optional<DType>>)
          return FieldKind::dtype;
        else if constexpr (std::is_same_v<T, Layout>)
          return FieldKind::layout;
        else if constexpr (std::is_same_v<T, SoftmaxType>)
          return FieldKind::softmax_type;
        else if constexpr (std::is_same_v<T, KVScale>)
          return FieldKind::kv_scale;
        else if constexpr (std::is_same_v<T, std::uint64_t>)
          return FieldKind::unsigned_integer;
        else
          return FieldKind::integer;
      },
      field.member);
}

bool field_optional(const SpecField& field) {
  return std::holds_alternative<std::optional<double> AttentionSpec::*>(field.member) ||
         std::holds_alternative<std::optional<DType> AttentionSpec::*>(field.member);
}

const SpecField* find_spec_field(std::string_view name) {
  for (const SpecField& f : kFields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string get_field(const AttentionSpec& spec, const SpecField& field) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = spec.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>)
          return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>)
          return real(v);
        else if constexpr (std::is_same_v<T, DType> || std::is_same_v<T, Layout> || std::is_same_v<T, SoftmaxType> ||
                           std::is_same_v<T, KVScale>)
          return std::string(to_string(v));
        else if constexpr (std::is_same_v<T, std::optional<double>>)
          return v ? real(*v) : "";
        else if constexpr (std::is_same_v<T, std::optional<DType>>)
          return v ? std::string(to_string(*v)) : "";
        else
          return std::to_string(v);
      },
      field.member);
}

void set_field(AttentionSpec& spec, const SpecField& field, std::string_view text) {
  std::visit(
      [&](auto member) {
        auto& v = spec.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>)
          v = parse_bool(field, text);
        else if constexpr (std::is_same_v<T, double>)
          v = parse_number<double>(field, text);
        else if constexpr (std::is_same_v<T, DType>)
          v = parse_dtype(text, field.name);
        else if constexpr (std::is_same_v<T, Layout>) {
          try {
            v = parse_layout(text);
          } catch (const Error&) {
            bad(field, text, "bshd, bhsd, sbhd or thd");
          }
        } else if constexpr (std::is_same_v<T, SoftmaxType>) {
          v = parse_softmax_type(text, field.name);
        } else if constexpr (std::is_same_v<T, KVScale>) {
          v = parse_kv_scale(text, field.name);
        } else if constexpr (std::is_same_v<T, std::optional<double>>) {
          v = text.empty() ? std::optional<double>{} : parse_number<double>(field, text);
        } else if constexpr (std::is_same_v<T, std::optional<DType>>) {
          v = text.empty() ? std::optional<DType>{} : parse_dtype(text, field.name);
        } else {
          v = parse_number<T>(field, text);
        }
      },
      field.member);
}

std::string spec_to_json(const AttentionSpec& spec) {
  std::string out = "{";
  for (const SpecField& f : kFields) {
    if (out.size() > 1) out += ", ";
    out += "\"" + std::string(f.name) + "\": ";
    const std::string v = get_field(spec, f);
    const bool quoted = std::holds_alternative<DType AttentionSpec::*>(f.member) ||
                        std::holds_alternative<Layout AttentionSpec::*>(f.member) ||
                        std::holds_alternative<SoftmaxType AttentionSpec::*>(f.member) ||
                        std::holds_alternative<KVScale AttentionSpec::*>(f.member) ||
                        std::holds_alternative<std::optional<DType> AttentionSpec::*>(f.member);
    if (v.empty())
      out += "null";
    else if (quoted)
      out += "\"" + v + "\"";
    else
      out += v;
  }
  return out + "}";
}

}  // namespace attend
