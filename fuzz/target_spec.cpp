// Spec + tensor validation, then the kernels on what validation accepted.
//
// Every tensor the fuzzer describes gets a buffer of exactly the elements its
// shape and strides can address (validation's notion of the view's extent), so
// a kernel that reads or writes one element past what validate_inputs accepted
// is an ASan report. Tensors too large to back are given a dummy pointer: they
// still exercise validation, but such a problem never runs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "byte_reader.h"
#include "targets.h"

namespace attend_fuzz {
namespace {

using attend::AttentionSpec;
using attend::DType;
using attend::Layout;
using attend::TensorView;
using Dims = std::vector<std::int64_t>;

constexpr std::int64_t kMaxBackedElements = 1 << 14;  // larger views get a dummy pointer

// Owns the buffers behind the fuzzed views.
struct Arena {
  std::vector<std::unique_ptr<std::byte[]>> buffers;
  alignas(64) std::byte dummy[64]{};
  bool all_backed = true;
};

Dims token_shape(const AttentionSpec& s, std::int64_t rows, std::int64_t total, std::int64_t heads, std::int64_t dim) {
  switch (s.layout) {
    case Layout::bshd: return {s.batch, rows, heads, dim};
    case Layout::bhsd: return {s.batch, heads, rows, dim};
    case Layout::sbhd: return {rows, s.batch, heads, dim};
    case Layout::thd: return {total, heads, dim};
  }
  return {};
}

// Largest element offset + 1 the view can address (0 when empty), or -1 when it
// overflows or a stride is negative; validation rejects those views anyway.
std::int64_t extent(const TensorView& t) {
  std::int64_t e = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return 0;
    if (t.shape[d] < 0 || t.strides[d] < 0) return -1;
    std::int64_t step = 0;
    if (__builtin_mul_overflow(t.shape[d] - 1, t.strides[d], &step) || __builtin_add_overflow(e, step, &e)) return -1;
  }
  if (e == std::numeric_limits<std::int64_t>::max()) return -1;
  return t.ndim == 0 ? 1 : e + 1;
}

void fill(const TensorView& t, std::int64_t n, ByteReader& in) {
  // Values in [-1, 1): the kernels' results stay comparable between backends.
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = (static_cast<double>((i * 2654435761u + in.remaining()) % 2001) - 1000.0) / 1000.0;
    if (t.dtype == DType::f64) t.as<double>()[i] = x;
    else if (t.dtype == DType::f32) t.as<float>()[i] = static_cast<float>(x);
  }
}

// A view of roughly `shape` (sometimes mutated), with fuzzed strides, backed by
// an exact-size buffer when small enough. `dtype` is the expected dtype.
TensorView make_view(ByteReader& in, Arena& arena, DType dtype, Dims shape) {
  TensorView t;
  t.dtype = in.rarely(16) ? static_cast<DType>(in.u8() % 5) : dtype;
  if (in.rarely(16)) shape.resize(in.u8() % (TensorView::kMaxDims + 1));
  if (shape.size() > static_cast<std::size_t>(TensorView::kMaxDims)) shape.resize(TensorView::kMaxDims);
  t.ndim = static_cast<int>(shape.size());
  for (int d = 0; d < t.ndim; ++d) t.shape[d] = in.rarely(12) ? in.size() : shape[d];
  const std::uint8_t mode = in.u8() % 4;
  std::int64_t inner = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    std::int64_t stride = inner;
    if (mode == 1 && d != t.ndim - 1) {  // padded rows
      const std::int64_t pad = in.u8() % 4;
      stride = inner > std::numeric_limits<std::int64_t>::max() - pad ? inner : inner + pad;
    }
    if (mode == 2) stride = d == t.ndim - 1 ? 1 : in.u8() % 9;           // overlapping / broadcast
    if (mode == 3) stride = in.size();                                   // anything
    t.strides[d] = stride;
    const std::int64_t dim = std::max<std::int64_t>(t.shape[d], 1);
    if (__builtin_mul_overflow(stride < 0 ? 0 : stride, dim, &inner)) inner = std::numeric_limits<std::int64_t>::max();
  }
  const std::int64_t n = extent(t);
  if (in.rarely(24)) {
    t.data = nullptr;
  } else if (n >= 0 && n <= kMaxBackedElements) {
    const std::size_t bytes = static_cast<std::size_t>(n) * attend::size_of(t.dtype);
    arena.buffers.emplace_back(new std::byte[bytes]);  // exactly the extent: ASan sees one past it
    t.data = arena.buffers.back().get();
    if (t.dtype == DType::i32) {
      for (std::int64_t i = 0; i < n; ++i) t.as<std::int32_t>()[i] = 0;
    } else {
      fill(t, n, in);
    }
  } else {
    t.data = arena.dummy;
    arena.all_backed = false;
  }
  return t;
}

// Fills an i32 vector view that we backed: value(i) for each entry.
template <typename F>
void fill_i32(const TensorView& t, F&& value) {
  if (t.data == nullptr || t.dtype != DType::i32 || t.ndim < 1 || extent(t) <= 0 || extent(t) > kMaxBackedElements) return;
  const std::int64_t rows = t.ndim == 2 ? t.shape[0] : 1, cols = t.shape[t.ndim - 1];
  const std::int64_t rs = t.ndim == 2 ? t.strides[0] : 0, cs = t.strides[t.ndim - 1];
  // Stride-0 views can name far more entries than they hold: write each entry
  // index at most kMaxBackedElements times in all.
  std::int64_t budget = kMaxBackedElements;
  for (std::int64_t r = 0; r < rows && budget > 0; ++r)
    for (std::int64_t c = 0; c < cols && budget-- > 0; ++c) t.as<std::int32_t>()[r * rs + c * cs] = value(r * cols + c);
}

// cu_seqlens contents: usually a valid prefix sum of small lengths, sometimes raw.
void fill_cu(const TensorView& t, ByteReader& in) {
  if (t.data == nullptr || t.dtype != DType::i32 || t.ndim != 1 || extent(t) < 0 || extent(t) > kMaxBackedElements) return;
  const bool raw = in.rarely(6);
  std::int32_t sum = 0;
  for (std::int64_t i = 0; i < std::min<std::int64_t>(t.shape[0], kMaxBackedElements); ++i) {
    std::int32_t v = 0;
    if (raw) v = static_cast<std::int32_t>(in.u32());
    else if (i > 0) v = sum += static_cast<std::int32_t>(in.u8() % 9);
    t.as<std::int32_t>()[i * t.strides[0]] = v;
  }
}

AttentionSpec make_spec(ByteReader& in) {
  AttentionSpec s;
  s.layout = static_cast<Layout>(in.u8() % 4);
  s.dtype = in.rarely(4) ? static_cast<DType>(in.u8() % 5) : DType::f32;
  s.batch = in.size();
  s.seqlen_q = in.size();
  s.seqlen_kv = in.size();
  s.heads_q = in.size();
  s.heads_kv = in.flag() ? s.heads_q : in.size();
  s.head_dim_qk = in.size();
  s.head_dim_v = in.flag() ? s.head_dim_qk : in.size();
  s.total_q = in.size();
  s.total_kv = in.size();
  if (in.flag()) s.scale = in.real(0.25 * static_cast<double>(in.u8() % 16));
  if (in.rarely(3)) s.softcap = in.real(static_cast<double>(in.u8() % 8));
  s.alibi = in.rarely(3);
  s.has_bias = in.rarely(3);
  s.bias_requires_grad = s.has_bias ? in.flag() : in.rarely(32);
  s.causal = in.flag();
  const auto window = [&] { const std::int64_t w = in.size(); return w == std::numeric_limits<std::int64_t>::min() ? w : w - 1; };
  if (in.flag()) s.window_left = window();
  if (in.flag()) s.window_right = window();
  if (in.rarely(3)) s.dropout_p = in.real(static_cast<double>(in.u8() % 10) / 10.0);
  s.dropout_seed = in.u64();
  s.need_lse = !in.rarely(4);
  s.deterministic = in.flag();
  if (in.rarely(4)) {  // a paged KV cache
    s.kv_page_size = in.size();
    s.kv_leftpad = in.flag();
  }
  return s;
}

bool tiny(const AttentionSpec& s) {
  const auto small = [](std::int64_t v, std::int64_t max) { return v >= 0 && v <= max; };
  return small(s.batch, 4) && small(s.seqlen_q, 16) && small(s.seqlen_kv, 16) && small(s.heads_q, 4) &&
         small(s.head_dim_qk, 32) && small(s.head_dim_v, 32) && small(s.total_q, 64) && small(s.total_kv, 64) &&
         (s.dtype == DType::f32 || s.dtype == DType::f64);
}

// Inputs in [-1, 1), moderate scale and softcap: f32 flash must agree with the
// f64-accumulating reference to well within 1e-3.
bool comparable(const AttentionSpec& s, const attend::Inputs& in) {
  // (A huge softcap is compared: beyond what f32 holds, flash and decode decline it.)
  if (std::fabs(s.effective_scale()) > 8 || (s.softcap != 0 && s.softcap < 0.125)) return false;
  if (s.alibi) {
    const TensorView& a = in.alibi_slopes;
    const std::int64_t n = extent(a);
    for (std::int64_t i = 0; i < n; ++i) {
      if (!(std::fabs(a.as<float>()[i]) <= 1)) return false;
    }
  }
  return true;
}

struct Outputs {
  attend::Tensor out, lse;
};

Outputs run_forward(const attend::Backend& b, const AttentionSpec& s, const attend::Inputs& in) {
  const DType lse_t = s.dtype == DType::f64 ? DType::f64 : DType::f32;
  const Dims o = token_shape(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_v);
  Outputs r;
  r.out = attend::Tensor::zeros(s.effective_out_dtype(), std::span<const std::int64_t>(o));
  r.lse = s.varlen() ? attend::Tensor::zeros(lse_t, {s.heads_q, s.total_q})
                     : attend::Tensor::zeros(lse_t, {s.batch, s.heads_q, s.seqlen_q});
  b.forward(attend::ForwardArgs{s, in, r.out, r.lse});
  return r;
}

void run_backward(const attend::Backend& b, const AttentionSpec& s, const attend::Inputs& in, const Outputs& f) {
  attend::Tensor dout = attend::Tensor::zeros_like(f.out);
  for (std::int64_t i = 0; i < dout.numel(); ++i) {
    const double x = static_cast<double>(i % 7) / 7.0 - 0.5;
    if (s.dtype == DType::f64) dout.as<double>()[i] = x;
    else dout.as<float>()[i] = static_cast<float>(x);
  }
  // Gradients contiguous in the inputs' shapes (the inputs' strides are fuzzed).
  const auto like = [](const TensorView& v) { return attend::Tensor::zeros_like(v); };
  TensorView q = in.q;
  q.dtype = s.effective_dq_dtype();
  attend::Tensor dq = like(q), dk = like(in.k), dv = like(in.v), dbias;
  if (s.bias_requires_grad) dbias = like(in.bias);
  b.backward(attend::BackwardArgs{s, in, f.out, f.lse, dout, dq, dk, dv, dbias});
}

double at(const attend::Tensor& t, std::int64_t i) {
  return t.view().dtype == DType::f64 ? t.as<double>()[i] : t.as<float>()[i];
}

void require_close(std::string_view backend, const char* what, const attend::Tensor& got, const attend::Tensor& want) {
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double g = at(got, i), w = at(want, i);
    if (g == w || (std::isnan(g) && std::isnan(w))) continue;
    if (!(std::fabs(g - w) <= 1e-3 * (1 + std::fabs(w)))) {
      std::fprintf(stderr, "%.*s %s[%lld] = %.9g, reference %.9g\n", static_cast<int>(backend.size()), backend.data(), what,
                   static_cast<long long>(i), g, w);
      std::abort();
    }
  }
}

}  // namespace

void spec(const std::uint8_t* data, std::size_t size) {
  ByteReader in(data, size);
  AttentionSpec s = make_spec(in);
  Arena arena;
  attend::Inputs inputs;
  // Shapes as validation expects them, computed without overflow concerns: a
  // spec that validate() rejects never gets this far in validate_inputs, and
  // the views then only need to exist.
  const DType dt = s.dtype;
  inputs.q = make_view(in, arena, dt, token_shape(s, s.seqlen_q, s.total_q, s.heads_q, s.head_dim_qk));
  if (s.paged() != in.rarely(16)) {
    // Page pools, a block table whose ids are mostly in range, key ends (and
    // starts) mostly within the table's capacity.
    const std::int64_t pages = in.size(), width = in.size(), ps = s.kv_page_size;
    inputs.k = make_view(in, arena, dt, {pages, ps, s.heads_kv, s.head_dim_qk});
    inputs.v = make_view(in, arena, dt, {pages, ps, s.heads_kv, s.head_dim_v});
    inputs.block_table = make_view(in, arena, DType::i32, {s.batch, width});
    const bool raw = in.rarely(8);
    fill_i32(inputs.block_table, [&](std::int64_t) {
      return raw ? static_cast<std::int32_t>(in.u32()) : static_cast<std::int32_t>(in.u8() % std::max<std::int64_t>(1, std::min<std::int64_t>(pages, 255)));
    });
    const std::int64_t cap = width >= 0 && ps >= 0 && width <= 64 && ps <= 64 ? width * ps : 255;
    std::vector<std::int32_t> ends;
    inputs.cache_seqlens = make_view(in, arena, DType::i32, {s.batch});
    fill_i32(inputs.cache_seqlens, [&](std::int64_t) {
      ends.push_back(raw ? static_cast<std::int32_t>(in.u32()) : static_cast<std::int32_t>(in.u8() % (cap + 1)));
      return ends.back();
    });
    if (s.kv_leftpad != in.rarely(16)) {
      inputs.cache_leftpad = make_view(in, arena, DType::i32, {s.batch});
      fill_i32(inputs.cache_leftpad, [&](std::int64_t i) {
        const std::int32_t end = static_cast<std::size_t>(i) < ends.size() ? ends[i] : 0;
        return raw ? static_cast<std::int32_t>(in.u32()) : static_cast<std::int32_t>(in.u8() % (std::max(end, 0) + 1));
      });
    }
  } else {
    inputs.k = make_view(in, arena, dt, token_shape(s, s.seqlen_kv, s.total_kv, s.heads_kv, s.head_dim_qk));
    inputs.v = make_view(in, arena, dt, token_shape(s, s.seqlen_kv, s.total_kv, s.heads_kv, s.head_dim_v));
  }
  if (s.has_bias != in.rarely(16)) {
    const std::int64_t bb = in.flag() ? 1 : s.batch, bh = in.flag() ? 1 : s.heads_q;
    inputs.bias = make_view(in, arena, dt, {bb, bh, s.seqlen_q, s.seqlen_kv});
  }
  if (s.alibi != in.rarely(16)) {
    inputs.alibi_slopes = make_view(in, arena, DType::f32, in.flag() ? Dims{s.heads_q} : Dims{s.batch, s.heads_q});
  }
  if (s.varlen() != in.rarely(16)) {
    const std::int64_t entries = s.batch < std::numeric_limits<std::int64_t>::max() ? s.batch + 1 : s.batch;
    inputs.cu_seqlens_q = make_view(in, arena, DType::i32, {entries});
    fill_cu(inputs.cu_seqlens_q, in);
    inputs.cu_seqlens_kv = make_view(in, arena, DType::i32, {entries});
    fill_cu(inputs.cu_seqlens_kv, in);
  }
  const bool training = in.flag();
  // Drawn last, and "unset" on an exhausted stream (which reads zeros), so that
  // the checked-in inputs, made before this field existed, still decode into
  // the problems they were found with.
  if (in.u8() % 8 == 7) s.dq_dtype = static_cast<DType>(in.u8() % 5);
  // The partial-problem fields, drawn after it for the same reason.
  if (in.u8() % 8 == 7) {
    s.q_offset = in.u8();
    s.kv_offset = in.u8();
  }
  if (in.u8() % 8 == 7) s.out_dtype = static_cast<DType>(in.u8() % 5);
  s.accumulate_grads = in.u8() % 8 == 7;  // the gradients start at zero: adding equals writing
  // Validating cu_seqlens or a block table reads every one of its batch+1 (or
  // batch) entries: linear work that a stride-0 view of 2^40 entries turns into
  // hours. That is the cost of the tensor's size, not a hang; keep runs short.
  if ((s.varlen() || s.paged()) && s.batch > (1 << 12)) return;
  // Validation reads the contents of the index tensors: they must be real.
  for (const TensorView* t : {&inputs.cu_seqlens_q, &inputs.cu_seqlens_kv, &inputs.block_table, &inputs.cache_seqlens,
                              &inputs.cache_leftpad}) {
    if (t->data == static_cast<const void*>(arena.dummy)) return;
  }

  try {
    attend::validate_inputs(s, inputs);
  } catch (const attend::Error&) {
    return;
  }
  if (!arena.all_backed || !tiny(s)) return;
  if (std::getenv("ATTEND_FUZZ_DEBUG")) {  // replaying a crash: say what it ran
    std::fprintf(stderr, "spec: %s paged=%lld leftpad=%d training=%d\n", attend::describe(s).c_str(),
                 static_cast<long long>(s.kv_page_size), s.kv_leftpad, training);
    for (const auto* t : {&inputs.q, &inputs.k, &inputs.v, &inputs.bias, &inputs.cu_seqlens_q, &inputs.cu_seqlens_kv,
                          &inputs.block_table, &inputs.cache_seqlens, &inputs.cache_leftpad}) {
      if (!t->defined()) continue;
      std::fprintf(stderr, "  view %s strides", t->shape_string().c_str());
      for (int d = 0; d < t->ndim; ++d) std::fprintf(stderr, " %lld", static_cast<long long>(t->strides[d]));
      if (t->dtype == DType::i32)
        for (std::int64_t i = 0; i < std::min<std::int64_t>(extent(*t), 16); ++i) std::fprintf(stderr, " [%d]", t->as<std::int32_t>()[i]);
      std::fprintf(stderr, "\n");
    }
  }

  // validate_inputs accepted the views, so every backend either declines the
  // spec through check() or runs without error: the built-ins (flash, decode,
  // ...) are each compared with the reference.
  static const std::shared_ptr<const attend::Backend> reference = attend::make_reference_backend();
  static const std::vector<attend::RegisteredBackend> others = [] {
    std::vector<attend::RegisteredBackend> v = attend::Registry::global().backends();
    std::erase_if(v, [](const auto& e) { return e.backend->name() == "reference"; });
    return v;
  }();
  const bool have_ref = reference->check(s, attend::Pass::forward).ok();
  Outputs want;
  if (have_ref) want = run_forward(*reference, s, inputs);
  if (have_ref && training && reference->check(s, attend::Pass::backward).ok()) run_backward(*reference, s, inputs, want);
  for (const auto& e : others) {
    const attend::Backend& b = *e.backend;
    if (!b.check(s, attend::Pass::forward).ok()) continue;
    const Outputs got = run_forward(b, s, inputs);
    if (have_ref && comparable(s, inputs)) {
      require_close(b.name(), "out", got.out, want.out);
      require_close(b.name(), "lse", got.lse, want.lse);
    }
    if (training && b.check(s, attend::Pass::backward).ok()) run_backward(b, s, inputs, got);
  }
}

}  // namespace attend_fuzz
