// Internal to the reference backend: the pieces both passes share — scratch
// carving, the resolved problem, logits, softmax and the dropout factors.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "attend/error.h"
#include "backends/reference/reference_kernels.h"
#include "kernel/half.h"
#include "kernel/layout.h"
#include "kernel/philox.h"
#include "kernel/semantics.h"

namespace attend::reference::impl {

using detail::KeyRange;

constexpr std::size_t kAlign = 64;

// Per-worker buffers, in carving order. kOutRow is O_i (forward) or dQ_i (backward).
enum Buf { kScores, kTanh, kBiasSlice, kFactors, kRowGrad, kOutRow, kDkAcc, kDvAcc, kNumBufs };
constexpr int kNumScoreBufs = 3;  // kScores, kTanh, kBiasSlice: the Sq x Sk matrices

// Size arithmetic that records overflow instead of throwing, because check()
// must give an answer (a `memory` reason) for any spec.
struct Sizer {
  bool overflow = false;
  std::size_t mul(std::size_t a, std::size_t b) {
    std::size_t r = 0;
    overflow |= __builtin_mul_overflow(a, b, &r);
    return r;
  }
  std::size_t add(std::size_t a, std::size_t b) {
    std::size_t r = 0;
    overflow |= __builtin_add_overflow(a, b, &r);
    return r;
  }
  std::size_t align(std::size_t n) { return mul((add(n, kAlign - 1)) / kAlign, kAlign); }
};

inline std::size_t nonneg(std::int64_t x) { return x < 0 ? 0 : static_cast<std::size_t>(x); }

struct BufferSizes {
  std::array<std::size_t, kNumBufs> bytes{};  // each rounded up to kAlign
  std::size_t elem = 8;
};

inline BufferSizes buffer_sizes(const AttentionSpec& s, Pass pass, bool acc64, Sizer& z) {
  BufferSizes b;
  b.elem = (acc64 || s.dtype == DType::f64) ? sizeof(double) : sizeof(float);
  const std::size_t sq = nonneg(s.seqlen_q), sk = nonneg(s.seqlen_kv);
  const std::size_t dqk = nonneg(s.head_dim_qk), dv = nonneg(s.head_dim_v);
  const std::size_t matrix = z.mul(sq, sk);
  std::array<std::size_t, kNumBufs> n{};
  // The spec does not say whether dbias will be broadcast, so the dbias slice
  // (used only then) is reserved whenever the bias has a gradient.
  n[kScores] = matrix;
  n[kFactors] = sk;
  if (pass == Pass::forward) {
    n[kOutRow] = dv;
  } else {
    n[kTanh] = s.softcap > 0 ? matrix : 0;
    n[kBiasSlice] = s.has_bias && s.bias_requires_grad ? matrix : 0;
    n[kRowGrad] = sk;
    n[kOutRow] = dqk;
    n[kDkAcc] = z.mul(sk, dqk);
    n[kDvAcc] = z.mul(sk, dv);
  }
  for (int i = 0; i < kNumBufs; ++i) b.bytes[i] = z.align(z.mul(n[i], b.elem));
  return b;
}

// Where one worker's buffers live, carved from its slice of the workspace.
template <typename Acc>
struct WorkerScratch {
  std::array<Acc*, kNumBufs> buf{};
  WorkerScratch(std::byte* base, const BufferSizes& sizes) {
    for (int i = 0; i < kNumBufs; ++i) {
      buf[i] = reinterpret_cast<Acc*>(base);
      base += sizes.bytes[i];
    }
  }
};

// The workspace split into per-worker slices. If the caller gave less than one
// slice (e.g. it sized the workspace for another spec), fall back to owning one.
struct Workers {
  std::byte* base = nullptr;
  std::size_t slice = 0;
  int count = 1;
  std::unique_ptr<std::byte[]> owned;

  Workers(const Workspace& ws, std::size_t slice_bytes, std::int64_t want) : slice(slice_bytes) {
    std::int64_t fit = 0;
    if (ws.data != nullptr && slice > 0) {
      const auto addr = reinterpret_cast<std::uintptr_t>(ws.data);
      const std::size_t pad = (kAlign - addr % kAlign) % kAlign;
      if (ws.bytes > pad) {
        base = static_cast<std::byte*>(ws.data) + pad;
        fit = static_cast<std::int64_t>((ws.bytes - pad) / slice);
      }
    }
    if (fit == 0) {
      owned.reset(new std::byte[slice + kAlign]);
      const auto addr = reinterpret_cast<std::uintptr_t>(owned.get());
      base = owned.get() + (kAlign - addr % kAlign) % kAlign;
      fit = 1;
    }
    count = static_cast<int>(std::min(want, fit));
  }
  std::byte* of(int thread) const { return base + static_cast<std::size_t>(thread) * slice; }
};

// Runs body(task, worker_memory) for task in [0, n). Each task writes a disjoint
// part of every output, so the schedule cannot change any bit of the result.
template <typename F>
void parallel_tasks(std::int64_t n, const Workers& w, F&& body) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(w.count) if (w.count > 1)
  for (std::int64_t t = 0; t < n; ++t) body(t, w.of(omp_get_thread_num()));
}

template <typename T>
void fill_view(const TensorView& t, T value) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] == 0) return;
  const int last = t.ndim - 1;
  std::array<std::int64_t, TensorView::kMaxDims> ix{};
  for (;;) {
    std::int64_t off = 0;
    for (int d = 0; d < last; ++d) off += ix[d] * t.strides[d];
    std::fill_n(t.as<T>() + off, t.shape[last], value);
    int d = last - 1;
    for (; d >= 0; --d) {
      if (++ix[d] < t.shape[d]) break;
      ix[d] = 0;
    }
    if (d < 0) return;
  }
}

// The LSE's storage type: f64 for f64 inputs, else f32 (bf16/f16 included).
template <typename T>
using Lse = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Calls fn(T{}, Acc{}) with the storage type of `dtype` and the accumulation
// type: double for f64 or when acc64, else float (half types are upcast).
template <typename Fn>
void dispatch_dtype(DType dtype, bool acc64, Fn&& fn) {
  const auto with_acc = [&](auto t) {
    if (acc64) fn(t, double{});
    else fn(t, float{});
  };
  switch (dtype) {
    case DType::f64: fn(double{}, double{}); return;
    case DType::bf16: with_acc(detail::bf16_t{}); return;
    case DType::f16: with_acc(detail::f16_t{}); return;
    default: with_acc(float{}); return;
  }
}

template <typename Acc, typename A, typename B>
Acc dot(const A* a, const B* b, std::int64_t n) {
  Acc s = 0;
  for (std::int64_t d = 0; d < n; ++d) s += static_cast<Acc>(a[d]) * static_cast<Acc>(b[d]);
  return s;
}

// Everything both passes read, resolved once outside the parallel region (the
// helpers from kernel/layout.h may throw; nothing inside a task does).
template <typename T, typename Acc>
struct Problem {
  const AttentionSpec* spec = nullptr;
  detail::MaskRule rule;  // windows and the partial problem's offsets
  const T *q = nullptr, *k = nullptr, *v = nullptr, *bias = nullptr;
  detail::TokenStrides qs, ks, vs;
  detail::PageTable pages;  // paged K/V: ks/vs are then the pools' strides
  detail::BiasStrides bs;
  std::vector<detail::SeqSpan> spans;  // per sequence
  std::vector<double> slopes;          // per (b, h); 0 without ALiBi
  std::vector<Acc> sinks;              // per h: the sink logit z_h; -inf without a sink
  Acc scale = 1, softcap = 0, keep_scale = 1;
  bool dropout = false;
  detail::DropoutMask mask;
  std::int64_t B = 1, H = 1, Hkv = 1, group = 1, dqk = 0, dv = 0;
  // ReferenceOptions::round_intermediates_to_input_dtype: every intermediate
  // matrix (scores, P, dP, dS) is rounded to T, as a naive same-precision
  // implementation stores them (the §3.3 baseline).
  bool round_inter = false;

  Acc rnd(Acc x) const { return round_inter ? detail::round_to<T>(x) : x; }

  Problem(const AttentionSpec& s, const Inputs& in, bool round_intermediates = false)
      : spec(&s),
        rule(detail::mask_rule(s)),
        q(in.q.as<const T>()),
        k(in.k.as<const T>()),
        v(in.v.as<const T>()),
        qs(detail::token_strides(in.q, s.layout)),
        ks(detail::token_strides(in.k, s.layout)),
        vs(detail::token_strides(in.v, s.layout)),
        scale(static_cast<Acc>(s.effective_scale())),
        softcap(static_cast<Acc>(s.softcap)),
        keep_scale(static_cast<Acc>(1.0 / (1.0 - s.dropout_p))),
        dropout(s.dropout_p > 0),
        mask(detail::DropoutMask::make(s.dropout_seed, s.dropout_p)),
        B(s.batch),
        H(s.heads_q),
        Hkv(s.heads_kv),
        group(s.group_size()),
        dqk(s.head_dim_qk),
        dv(s.head_dim_v),
        round_inter(round_intermediates) {
    if (s.paged()) {
      pages = detail::page_table(s, in);
      ks = detail::pool_strides(in.k);
      vs = detail::pool_strides(in.v);
    }
    if (s.has_bias) {
      bias = in.bias.as<const T>();
      bs = detail::bias_strides(in.bias);
    }
    for (std::int64_t b = 0; b < B; ++b) spans.push_back(detail::sequence_span(s, in, b));
    sinks.assign(static_cast<std::size_t>(H),
                 static_cast<Acc>(s.has_sink() ? 0.0 : -std::numeric_limits<double>::infinity()));
    for (std::int64_t h = 0; h < H && s.softmax_type == SoftmaxType::learnable; ++h) {
      sinks[h] = in.sinks.dtype == DType::f64 ? static_cast<Acc>(in.sinks.as<const double>()[h])
                                              : static_cast<Acc>(in.sinks.as<const float>()[h]);
    }
    slopes.assign(static_cast<std::size_t>(B * H), 0.0);
    for (std::int64_t b = 0; b < B && s.alibi; ++b)
      for (std::int64_t h = 0; h < H; ++h) slopes[b * H + h] = detail::alibi_slope(s, in, b, h);
  }
  KeyRange keys(std::int64_t b, std::int64_t i) const {
    return detail::visible_keys(rule, i, spans[b].q_len, spans[b].kv_len);
  }
  const T* k_row(std::int64_t b, std::int64_t j, std::int64_t kvh) const {
    if (pages.paged()) return k + pages.offset(ks, b, spans[b].kv_begin + j, kvh);
    return k + ks.offset(b, spans[b].kv_begin + j, kvh);
  }
  const T* v_row(std::int64_t b, std::int64_t j, std::int64_t kvh) const {
    if (pages.paged()) return v + pages.offset(vs, b, spans[b].kv_begin + j, kvh);
    return v + vs.offset(b, spans[b].kv_begin + j, kvh);
  }
};

constexpr auto kNegInf = -std::numeric_limits<double>::infinity();

// S (q_len x kv_len, row-major) <- final logits of (b, h), -inf outside the
// mask. tanh_out (optional) keeps t = tanh(x / softcap) for the backward.
template <typename T, typename Acc>
void logits(const Problem<T, Acc>& pr, std::int64_t b, std::int64_t h, Acc* S, Acc* tanh_out) {
  const detail::SeqSpan& sp = pr.spans[b];
  const std::int64_t sq = sp.q_len, sk = sp.kv_len, kvh = h / pr.group;
  const double slope = pr.slopes[b * pr.H + h];
  for (std::int64_t i = 0; i < sq; ++i) {
    Acc* row = S + i * sk;
    std::fill_n(row, sk, static_cast<Acc>(kNegInf));
    const T* qi = pr.q + pr.qs.offset(b, sp.q_begin + i, h);
    const KeyRange r = pr.keys(b, i);
    // Only a row with keys addresses the bias: with seqlen_kv = 0 the bias is
    // empty and validation (rightly) accepts any strides, so offset(b, h, i)
    // could overflow a pointer even though nothing would be read.
    const T* bi = pr.bias && r.end > r.begin ? pr.bias + pr.bs.offset(b, h, i) : nullptr;
    for (std::int64_t j = r.begin; j < r.end; ++j) {
      const Acc x = pr.rnd(pr.scale * dot<Acc>(qi, pr.k_row(b, j, kvh), pr.dqk));
      Acc s = x;
      if (pr.softcap > 0) {
        const Acc t = pr.rnd(std::tanh(x / pr.softcap));
        s = pr.rnd(pr.softcap * t);
        if (tanh_out) tanh_out[i * sk + j] = t;
      }
      if (pr.spec->alibi) s = pr.rnd(s + static_cast<Acc>(detail::alibi_term(pr.rule, slope, i, j, sq, sk)));
      if (bi) s = pr.rnd(s + static_cast<Acc>(bi[j]));
      row[j] = s;
    }
  }
}

// In place, logits -> probabilities; returns the natural-log LSE. A row whose
// visible logits are all -inf (no visible key, or all -inf from the bias) is
// fully masked: P = 0 and LSE = -inf, so it contributes nothing anywhere. A NaN
// logit makes the max NaN (std::max would drop it) and with it P and the LSE;
// a +inf one gives exp(inf - inf) = NaN, as IEEE arithmetic does.
// z is the row's sink logit (-inf: none): one more term of the denominator,
// whose probability goes to *p_sink (when given); a fully masked row then has
// LSE = z and p_sink = 1.
template <typename Acc>
Acc softmax_row(Acc* row, std::int64_t sk, KeyRange r, Acc z = static_cast<Acc>(kNegInf), Acc* p_sink = nullptr) {
  Acc m = static_cast<Acc>(kNegInf);
  for (std::int64_t j = r.begin; j < r.end && !std::isnan(m); ++j) m = std::isnan(row[j]) || row[j] > m ? row[j] : m;
  if (p_sink) *p_sink = 0;
  if (m == static_cast<Acc>(kNegInf)) {
    std::fill_n(row, sk, Acc{0});
    if (p_sink && z != static_cast<Acc>(kNegInf)) *p_sink = 1;
    return z;
  }
  if (!std::isnan(m) && z > m) m = z;
  Acc sum = 0;
  for (std::int64_t j = r.begin; j < r.end; ++j) sum += (row[j] = std::exp(row[j] - m));
  const Acc sink_term = std::exp(z - m);  // 0 without a sink
  sum += sink_term;
  for (std::int64_t j = 0; j < sk; ++j) row[j] = (j >= r.begin && j < r.end) ? row[j] / sum : Acc{0};
  if (p_sink) *p_sink = sink_term / sum;
  return m + std::log(sum);
}

// P rounded to the input dtype when the problem rounds intermediates.
template <typename T, typename Acc>
void round_row(const Problem<T, Acc>& pr, Acc* row, KeyRange r) {
  if (!pr.round_inter) return;
  for (std::int64_t j = r.begin; j < r.end; ++j) row[j] = pr.rnd(row[j]);
}

// f[j] = keep(b, h, i, j) / (1 - p), drawn at the global position
// (q_offset + i, kv_offset + j): one Philox call serves four columns.
template <typename T, typename Acc>
void dropout_factors(const Problem<T, Acc>& pr, std::int64_t b, std::int64_t h, std::int64_t i, KeyRange r,
                     Acc* f) {
  std::array<std::uint32_t, 4> w{};
  std::int64_t block = -1;
  const std::int64_t row = pr.rule.q_offset + i;
  for (std::int64_t j = r.begin; j < r.end; ++j) {
    const std::int64_t col = pr.rule.kv_offset + j;
    if ((col >> 2) != block) w = pr.mask.words(b, h, row, block = col >> 2);
    f[j] = w[col & 3] < pr.mask.threshold ? pr.keep_scale : Acc{0};
  }
}

template <typename Fn>
void guard_alloc(Fn&& fn) {
  try {
    fn();
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::out_of_memory, "reference.workspace", "",
                "reference backend scratch allocation failed");
  }
}

}  // namespace attend::reference::impl
