// Tensor validation: every view a backend will read or write is checked against
// the spec before any kernel runs, so kernels may index without bounds checks.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attend/backend.h"
#include "attend/error.h"
#include "runtime/checked.h"
#include "runtime/validate.h"

namespace attend {
namespace {

using Dims = std::vector<std::int64_t>;

std::string dims_string(const Dims& d) {
  std::string s = "(";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + ")";
}

Dims dims_of(const Shape& shape) { return Dims(shape.dims, shape.dims + shape.ndim); }

Dims expected(const AttentionSpec& s, Role role) { return dims_of(expected_shape(s, role)); }

// Checks dtype, shape, strides and pointer; and that the furthest element the
// view can address is representable in bytes, so offsets never overflow.
void check_view(const char* name, const TensorView& t, DType dtype, const Dims& shape, Device device) {
  if (!t.defined()) {
    throw Error(ErrorCode::invalid_argument, name, "undefined", "tensor is required");
  }
  if (!(t.device == device)) {
    throw Error(ErrorCode::invalid_argument, std::string(name) + ".device", to_string(t.device),
                "all tensors of a call must be on one device (q is on " + to_string(device) + ")");
  }
  if (t.dtype != dtype) {
    throw Error(ErrorCode::invalid_argument, std::string(name) + ".dtype", std::string(to_string(t.dtype)),
                "expected " + std::string(to_string(dtype)));
  }
  if (t.ndim != static_cast<int>(shape.size())) {
    throw Error(ErrorCode::shape_mismatch, std::string(name) + ".shape", t.shape_string(),
                "expected " + dims_string(shape));
  }
  std::int64_t extent = 0;  // largest element offset + 1
  bool empty = false;
  for (int d = 0; d < t.ndim; ++d) {
    const std::string dim = std::string(name) + ".shape[" + std::to_string(d) + "]";
    if (t.shape[d] != shape[d]) {
      throw Error(ErrorCode::shape_mismatch, dim, std::to_string(t.shape[d]),
                  "expected " + std::to_string(shape[d]) + " for " + name + dims_string(shape));
    }
    if (t.strides[d] < 0) {
      throw Error(ErrorCode::invalid_argument, std::string(name) + ".strides[" + std::to_string(d) + "]",
                  std::to_string(t.strides[d]), "strides must be non-negative");
    }
    if (t.shape[d] == 0) empty = true;
    extent = detail::checked_add(extent, detail::checked_mul(t.shape[d] - (t.shape[d] > 0 ? 1 : 0), t.strides[d], name),
                                 name);
  }
  // An empty view addresses nothing, so its strides cannot matter (torch's
  // gradient of x.sum() for an empty x has strides of 0 everywhere).
  if (!empty && t.ndim > 0 && t.shape[t.ndim - 1] > 1 && t.strides[t.ndim - 1] != 1) {
    throw Error(ErrorCode::invalid_argument, std::string(name) + ".strides[" + std::to_string(t.ndim - 1) + "]",
                std::to_string(t.strides[t.ndim - 1]), "the last dimension must be contiguous (stride 1)");
  }
  (void)detail::checked_bytes(detail::checked_add(extent, 1, name), size_of(t.dtype), name);
  if (!empty && t.data == nullptr) {
    throw Error(ErrorCode::invalid_argument, std::string(name) + ".data", "null",
                "null pointer for a tensor with " + std::to_string(t.numel()) + " elements");
  }
}

// The device every tensor of a call must share: q's.
Device device_of(const Inputs& in) { return in.q.device; }

void check_absent(const char* name, const TensorView& t, const char* flag) {
  if (t.defined()) {
    throw Error(ErrorCode::invalid_argument, name, t.shape_string(), std::string("given but spec.") + flag + " is off");
  }
}

// cu_seqlens must start at 0, never decrease, stay inside the packed tensor and
// keep every sequence within the declared maximum length. Reads host memory.
void check_cu_seqlens(const char* name, const TensorView& cu, const AttentionSpec& s, std::int64_t total,
                      std::int64_t max_len, const char* max_field) {
  const auto* p = cu.as<const std::int32_t>();
  const auto at = [&](std::int64_t b) { return static_cast<std::int64_t>(p[b * cu.strides[0]]); };
  const auto field = [&](std::int64_t b) { return std::string(name) + "[" + std::to_string(b) + "]"; };
  if (at(0) != 0) {
    throw Error(ErrorCode::invalid_argument, field(0), std::to_string(at(0)), "must be 0");
  }
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const std::int64_t len = at(b + 1) - at(b);
    if (len < 0) {
      throw Error(ErrorCode::invalid_argument, field(b + 1), std::to_string(at(b + 1)),
                  "cu_seqlens must be non-decreasing (previous entry " + std::to_string(at(b)) + ")");
    }
    if (len > max_len) {
      throw Error(ErrorCode::invalid_argument, field(b + 1), std::to_string(at(b + 1)),
                  "sequence " + std::to_string(b) + " has length " + std::to_string(len) + " above spec." + max_field,
                  std::to_string(max_len));
    }
  }
  if (at(s.batch) > total) {
    throw Error(ErrorCode::invalid_argument, field(s.batch), std::to_string(at(s.batch)),
                "exceeds the packed token count", std::to_string(total));
  }
}

// Paged K/V shapes: two page pools of the same page count, a block table, the
// per-sequence key ends (and starts).
void check_paged_shapes(const AttentionSpec& s, const Inputs& in, Device dev) {
  const std::int64_t pages = in.k.defined() && in.k.ndim == 4 ? in.k.shape[0] : 0;
  const std::int64_t ps = s.kv_page_size;
  check_view("k", in.k, s.effective_kv_dtype(), {pages, ps, s.heads_kv, s.head_dim_qk}, dev);
  check_view("v", in.v, s.effective_kv_dtype(), {pages, ps, s.heads_kv, s.head_dim_v}, dev);
  const TensorView& bt = in.block_table;
  const std::int64_t width = bt.defined() && bt.ndim == 2 ? bt.shape[1] : 0;
  check_view("block_table", bt, DType::i32, {s.batch, width}, dev);
  check_view("cache_seqlens", in.cache_seqlens, DType::i32, {s.batch}, dev);
  if (s.kv_leftpad) {
    check_view("cache_leftpad", in.cache_leftpad, DType::i32, {s.batch}, dev);
  } else {
    check_absent("cache_leftpad", in.cache_leftpad, "kv_leftpad");
  }
  (void)detail::checked_mul(width, ps, "block_table capacity");
}

// Paged K/V contents: every page a sequence's keys touch must be a valid page
// id, so kernels can follow the table without bounds checks. Reads host memory.
void check_paged_contents(const AttentionSpec& s, const Inputs& in) {
  const std::int64_t pages = in.k.shape[0], ps = s.kv_page_size;
  const TensorView& bt = in.block_table;
  const std::int64_t capacity = bt.shape[1] * ps;
  const auto* table = bt.as<const std::int32_t>();
  const auto field = [](const char* name, std::int64_t b) { return std::string(name) + "[" + std::to_string(b) + "]"; };
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const std::int64_t end = in.cache_seqlens.as<const std::int32_t>()[b * in.cache_seqlens.strides[0]];
    const std::int64_t begin =
        s.kv_leftpad ? in.cache_leftpad.as<const std::int32_t>()[b * in.cache_leftpad.strides[0]] : 0;
    if (end < 0 || end > capacity) {
      throw Error(ErrorCode::invalid_argument, field("cache_seqlens", b), std::to_string(end),
                  "must lie in [0, block_table columns * kv_page_size]", std::to_string(capacity));
    }
    if (begin < 0 || begin > end) {
      throw Error(ErrorCode::invalid_argument, field("cache_leftpad", b), std::to_string(begin),
                  "must lie in [0, cache_seqlens[b]]", std::to_string(end));
    }
    if (end - begin > s.seqlen_kv) {
      throw Error(
          ErrorCode::invalid_argument, field("cache_seqlens", b), std::to_string(end),
          "sequence " + std::to_string(b) + " has " + std::to_string(end - begin) + " keys, above spec.seqlen_kv",
          std::to_string(s.seqlen_kv));
    }
    // ceil_div: end + ps - 1 overflowed for a page size near INT64_MAX (found by fuzz_spec).
    for (std::int64_t pg = begin / ps; pg < detail::ceil_div(end, ps); ++pg) {
      const std::int64_t id = table[b * bt.strides[0] + pg * bt.strides[1]];
      if (id < 0 || id >= pages) {
        throw Error(ErrorCode::invalid_argument, "block_table[" + std::to_string(b) + "][" + std::to_string(pg) + "]",
                    std::to_string(id), "page id out of range for a pool of " + std::to_string(pages) + " pages",
                    std::to_string(pages));
      }
    }
  }
}

// A NaN or infinite sink logit would make every row of its head NaN (or, for
// -inf, silently vanilla): rejected by name instead.
void check_sinks(const AttentionSpec& s, const TensorView& z) {
  for (std::int64_t h = 0; h < s.heads_q; ++h) {
    const double x = z.dtype == DType::f64 ? z.as<const double>()[h * z.strides[0]]
                                           : static_cast<double>(z.as<const float>()[h * z.strides[0]]);
    if (!std::isfinite(x)) {
      std::ostringstream os;
      os << x;
      throw Error(ErrorCode::invalid_argument, "sinks[" + std::to_string(h) + "]", os.str(),
                  "sink logits must be finite");
    }
  }
}

// The shape of k_scale / v_scale: a paged per-token pool has k's page count.
Dims scale_shape(const AttentionSpec& s, Role role, const Inputs& in) {
  Dims d = expected(s, role);
  if (s.paged() && s.kv_scale == KVScale::per_token) d[0] = in.k.defined() && in.k.ndim == 4 ? in.k.shape[0] : 0;
  return d;
}

// Every scale a forward will read must be finite and > 0: a zero, negative or
// NaN scale would turn the cache's codes into garbage silently. Per-token
// scales are checked for the tokens the sequences read (paged: through the
// block table). This runs on every decode step over the whole cache, so runs
// of contiguous scales are checked by a loop without branches (vectorized)
// and the index of a bad scale is found only after one fails.
bool scales_ok(const float* x, std::int64_t n) {
  // A positive finite float's bits lie in [1, 0x7f7fffff]; minus one, as
  // unsigned, zero and negatives wrap above and inf/NaN stay above: one max.
  std::uint32_t worst = 0;
  for (std::int64_t i = 0; i < n; ++i) worst = std::max(worst, std::bit_cast<std::uint32_t>(x[i]) - 1u);
  return worst < 0x7f7fffffu;
}

void check_scales(const AttentionSpec& s, const Inputs& in) {
  for (const auto& which : {std::pair{"k_scale", &in.k_scale}, std::pair{"v_scale", &in.v_scale}}) {
    // Plain names, not a structured binding: the lambda below captures them
    // (clang before 16 cannot capture a binding).
    const char* name = which.first;
    const TensorView* t = which.second;
    const auto* base = t->as<const float>();
    const auto check = [&](std::int64_t offset, auto... index) {
      const float x = base[offset];
      if (std::isfinite(x) && x > 0.0f) [[likely]] {
        return;
      }
      std::string where;
      ((where += "[" + std::to_string(index) + "]"), ...);
      std::ostringstream os;
      os << x;
      throw Error(ErrorCode::invalid_argument, std::string(name) + where, os.str(),
                  "a K/V scale must be finite and > 0 (the value a code stands for is code * scale)");
    };
    if (s.kv_scale == KVScale::per_tensor) {
      check(0, 0);
    } else if (s.kv_scale == KVScale::per_head) {
      for (std::int64_t b = 0; b < s.batch; ++b)
        for (std::int64_t h = 0; h < s.heads_kv; ++h) check(b * t->strides[0] + h * t->strides[1], b, h);
    } else if (s.paged()) {
      const TensorView& bt = in.block_table;
      const auto* table = bt.as<const std::int32_t>();
      const std::int64_t ps = s.kv_page_size, hk = s.heads_kv;
      // A page's rows [r0, r1) of every head: one contiguous run when the pool is.
      const bool dense = t->strides[2] == 1 && t->strides[1] == hk;
      for (std::int64_t b = 0; b < s.batch; ++b) {
        const std::int64_t end = in.cache_seqlens.as<const std::int32_t>()[b * in.cache_seqlens.strides[0]];
        const std::int64_t begin =
            s.kv_leftpad ? in.cache_leftpad.as<const std::int32_t>()[b * in.cache_leftpad.strides[0]] : 0;
        for (std::int64_t tok = begin; tok < end;) {
          const std::int64_t page = table[b * bt.strides[0] + tok / ps * bt.strides[1]];
          const std::int64_t r0 = tok % ps, r1 = std::min(ps, r0 + (end - tok));
          const std::int64_t off = page * t->strides[0] + r0 * t->strides[1];
          if (!dense || !scales_ok(base + off, (r1 - r0) * hk)) {
            for (std::int64_t r = r0; r < r1; ++r)
              for (std::int64_t h = 0; h < hk; ++h)
                check(page * t->strides[0] + r * t->strides[1] + h * t->strides[2], page, r, h);
          }
          tok += r1 - r0;
        }
      }
    } else {
      // Dense layouts: every element is a (token, kv head) some sequence reads,
      // except thd rows past cu_seqlens_kv[B], which nothing reads.
      std::int64_t n0 = t->shape[0];
      if (s.varlen()) n0 = in.cu_seqlens_kv.as<const std::int32_t>()[s.batch * in.cu_seqlens_kv.strides[0]];
      const std::int64_t n1 = t->shape[1], n2 = t->ndim == 3 ? t->shape[2] : 1;
      const std::int64_t s2 = t->ndim == 3 ? t->strides[2] : 1;
      for (std::int64_t i = 0; i < n0; ++i) {
        for (std::int64_t j = 0; j < n1; ++j) {
          const std::int64_t off = i * t->strides[0] + j * t->strides[1];
          if (s2 == 1 && scales_ok(base + off, n2)) continue;
          for (std::int64_t l = 0; l < n2; ++l) {
            if (t->ndim == 3)
              check(off + l * s2, i, j, l);
            else
              check(off, i, j);
          }
        }
      }
    }
  }
}

// dk/dv of paged pools have the pools' shapes; otherwise the spec's.
Dims grad_shape(const AttentionSpec& s, Role role, const TensorView& input) {
  if (s.paged()) return Dims(input.shape.begin(), input.shape.begin() + input.ndim);
  return expected(s, role);
}

}  // namespace

void validate_input_shapes(const AttentionSpec& s, const Inputs& in) {
  const Device dev = device_of(in);
  check_view("q", in.q, s.dtype, expected(s, Role::q), dev);
  if (s.paged()) {
    check_paged_shapes(s, in, dev);
  } else {
    check_view("k", in.k, s.effective_kv_dtype(), expected(s, Role::k), dev);
    check_view("v", in.v, s.effective_kv_dtype(), expected(s, Role::v), dev);
    check_absent("block_table", in.block_table, "kv_page_size");
    check_absent("cache_seqlens", in.cache_seqlens, "kv_page_size");
    check_absent("cache_leftpad", in.cache_leftpad, "kv_leftpad");
  }
  if (s.has_bias) {
    const TensorView& b = in.bias;
    // Broadcast dims (size 1) are allowed over batch and heads.
    const bool four = b.defined() && b.ndim == 4;
    const std::int64_t bb = four && b.shape[0] == 1 ? 1 : s.batch, bh = four && b.shape[1] == 1 ? 1 : s.heads_q;
    check_view("bias", b, s.dtype, {bb, bh, s.seqlen_q, s.seqlen_kv}, dev);
  } else {
    check_absent("bias", in.bias, "has_bias");
  }
  if (s.alibi) {
    const TensorView& a = in.alibi_slopes;
    check_view("alibi_slopes", a, DType::f32, a.ndim == 2 ? Dims{s.batch, s.heads_q} : Dims{s.heads_q}, dev);
  } else {
    check_absent("alibi_slopes", in.alibi_slopes, "alibi");
  }
  if (s.softmax_type == SoftmaxType::learnable) {
    check_view("sinks", in.sinks, s.lse_dtype(), {s.heads_q}, dev);
  } else {
    check_absent("sinks", in.sinks, "softmax_type=learnable");
  }
  if (s.kv_scale != KVScale::none) {
    check_view("k_scale", in.k_scale, DType::f32, scale_shape(s, Role::k_scale, in), dev);
    check_view("v_scale", in.v_scale, DType::f32, scale_shape(s, Role::v_scale, in), dev);
  } else {
    check_absent("k_scale", in.k_scale, "kv_scale");
    check_absent("v_scale", in.v_scale, "kv_scale");
  }
  if (s.varlen()) {
    check_view("cu_seqlens_q", in.cu_seqlens_q, DType::i32, {detail::checked_add(s.batch, 1, "cu_seqlens_q")}, dev);
    check_view("cu_seqlens_kv", in.cu_seqlens_kv, DType::i32, {detail::checked_add(s.batch, 1, "cu_seqlens_kv")}, dev);
  } else {
    check_absent("cu_seqlens_q", in.cu_seqlens_q, "layout=thd");
    check_absent("cu_seqlens_kv", in.cu_seqlens_kv, "layout=thd");
  }
}

void validate_contents(const AttentionSpec& s, const Inputs& in) {
  if (!in.q.device.is_host()) return;  // device memory: the backend's kernels validate it (its check says so)
  if (s.varlen()) {
    check_cu_seqlens("cu_seqlens_q", in.cu_seqlens_q, s, s.total_q, s.seqlen_q, "seqlen_q");
    check_cu_seqlens("cu_seqlens_kv", in.cu_seqlens_kv, s, s.total_kv, s.seqlen_kv, "seqlen_kv");
  }
  if (s.paged()) check_paged_contents(s, in);
  if (s.softmax_type == SoftmaxType::learnable) check_sinks(s, in.sinks);
  if (s.kv_scale != KVScale::none) check_scales(s, in);
}

void validate_inputs(const AttentionSpec& s, const Inputs& in) {
  validate(s);
  validate_input_shapes(s, in);
  validate_contents(s, in);
}

namespace detail {

void validate_forward_tensors(const ForwardArgs& a, bool inputs_checked) {
  const AttentionSpec& s = a.spec;
  const Device dev = device_of(a.in);
  if (!inputs_checked) validate_input_shapes(s, a.in);
  check_view("out", a.out, s.effective_out_dtype(), expected(s, Role::out), dev);
  check_view("lse", a.lse, s.lse_dtype(), expected(s, Role::lse), dev);
  validate_contents(s, a.in);
}

void validate_backward_tensors(const BackwardArgs& a, bool inputs_checked) {
  const AttentionSpec& s = a.spec;
  const Device dev = device_of(a.in);
  if (!inputs_checked) validate_input_shapes(s, a.in);
  check_view("out", a.out, s.effective_out_dtype(), expected(s, Role::out), dev);
  check_view("lse", a.lse, s.lse_dtype(), expected(s, Role::lse), dev);
  check_view("dout", a.dout, s.effective_out_dtype(), expected(s, Role::dout), dev);
  check_view("dq", a.dq, s.effective_dq_dtype(), expected(s, Role::dq), dev);
  if (s.kv_quantized()) {
    throw Error(ErrorCode::unsupported, "kv_dtype", std::string(to_string(s.effective_kv_dtype())),
                "8-bit K/V is an inference cache: there is no backward pass for it");
  }
  check_view("dk", a.dk, s.dtype, grad_shape(s, Role::dk, a.in.k), dev);
  check_view("dv", a.dv, s.dtype, grad_shape(s, Role::dv, a.in.v), dev);
  if (s.bias_requires_grad) {
    const TensorView& b = a.in.bias;
    check_view("dbias", a.dbias, s.dtype, Dims(b.shape.begin(), b.shape.begin() + b.ndim), dev);
  } else {
    check_absent("dbias", a.dbias, "bias_requires_grad");
  }
  if (s.softmax_type == SoftmaxType::learnable) {
    check_view("dsinks", a.dsinks, s.lse_dtype(), {s.heads_q}, dev);
  } else {
    check_absent("dsinks", a.dsinks, "softmax_type=learnable");
  }
  validate_contents(s, a.in);
}

}  // namespace detail

void validate_forward(const ForwardArgs& a) {
  validate(a.spec);
  detail::validate_forward_tensors(a);
}

void validate_backward(const BackwardArgs& a) {
  validate(a.spec);
  detail::validate_backward_tensors(a);
}

}  // namespace attend
