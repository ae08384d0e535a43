#include "unfused.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <new>
#include <string>

#include "attend/device.h"
#include "attend/error.h"
#include "kernel/semantics.h"

namespace attend::bench {

namespace {

// One (batch, head) slice of a dense q/k/v-like tensor as a row-major matrix:
// rows are tokens, `ld` the element distance between consecutive tokens.
struct Mat {
  float* p = nullptr;
  blasint ld = 0;
};

blasint to_blas(std::int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    throw Error(ErrorCode::overflow, what, std::to_string(v), "exceeds the 32-bit BLAS integer range",
                std::to_string(INT_MAX));
  }
  return static_cast<blasint>(v);
}

// Checked once per tensor before the parallel loops (which must not throw).
void check_rows(const TensorView& t, Layout layout, const char* name) {
  const auto& st = t.strides;
  const std::int64_t ld = layout == Layout::bshd ? st[1] : layout == Layout::bhsd ? st[2] : st[0];
  // BLAS needs lda >= columns; a dense view always has it, a broadcast one may not.
  if (ld < t.shape[3]) {
    throw Error(ErrorCode::invalid_argument, name, "token stride " + std::to_string(ld),
                "the unfused baseline needs rows at least head_dim apart", std::to_string(t.shape[3]));
  }
  to_blas(ld, name);
}

Mat head(const TensorView& t, Layout layout, std::int64_t b, std::int64_t h) {
  const auto& st = t.strides;
  std::int64_t offset = 0, ld = 0;
  switch (layout) {
    case Layout::bshd: offset = b * st[0] + h * st[2]; ld = st[1]; break;
    case Layout::bhsd: offset = b * st[0] + h * st[1]; ld = st[2]; break;
    case Layout::sbhd: offset = b * st[1] + h * st[2]; ld = st[0]; break;
    case Layout::thd: break;  // declined by check()
  }
  return {t.as<float>() + offset, static_cast<blasint>(ld)};
}

// OpenBLAS single-threaded for the guard's lifetime: the baseline runs one
// (batch, head) per OpenMP thread, and a threaded sgemm inside that loop (or
// OpenBLAS's spinning pool next to OpenMP's) would oversubscribe the cores.
class SerialBlas {
 public:
  SerialBlas() : previous_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
  ~SerialBlas() { openblas_set_num_threads(previous_); }
  SerialBlas(const SerialBlas&) = delete;
  SerialBlas& operator=(const SerialBlas&) = delete;

 private:
  int previous_;
};

void require_like(const TensorView& t, const TensorView& like, const char* name) {
  bool ok = t.defined() && t.dtype == DType::f32 && t.ndim == like.ndim && t.strides[t.ndim - 1] == 1 &&
            t.data != nullptr;
  for (int d = 0; ok && d < like.ndim; ++d) ok = t.shape[d] == like.shape[d];
  if (!ok) {
    throw Error(ErrorCode::shape_mismatch, name, std::string(to_string(t.dtype)) + " " + t.shape_string(),
                std::string("the unfused baseline needs ") + name + " as contiguous-last-dim f32 " +
                    like.shape_string());
  }
}

// The output's shape: q's with the last dimension Dv.
TensorView out_like(const TensorView& q, std::int64_t dv) {
  TensorView t = q;
  t.shape[3] = dv;
  return t;
}

// Writes -inf outside the visible keys of each row, then a plain softmax per
// row; a row with no visible key becomes all zeros (attend's empty-row rule).
void mask_and_softmax(const AttentionSpec& s, float* scores, std::int64_t sq, std::int64_t sk) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < sq; ++i) {
    float* row = scores + i * sk;
    if (s.is_masked()) {
      const detail::KeyRange r = detail::visible_keys(s, i, sq, sk);
      const std::int64_t begin = std::clamp<std::int64_t>(r.begin, 0, sk);
      const std::int64_t end = std::clamp<std::int64_t>(r.end, begin, sk);
      for (std::int64_t j = 0; j < begin; ++j) row[j] = neg_inf;
      for (std::int64_t j = end; j < sk; ++j) row[j] = neg_inf;
    }
    float max = neg_inf;
    for (std::int64_t j = 0; j < sk; ++j) max = std::max(max, row[j]);
    if (max == neg_inf) {
      std::fill(row, row + sk, 0.0f);
      continue;
    }
    float sum = 0.0f;
    for (std::int64_t j = 0; j < sk; ++j) {
      row[j] = std::exp(row[j] - max);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (std::int64_t j = 0; j < sk; ++j) row[j] *= inv;
  }
}

// dS = P o (dP - rowsum(dP o P)), in place over dP.
void softmax_backward(const float* probs, float* dprobs, std::int64_t sq, std::int64_t sk) {
  for (std::int64_t i = 0; i < sq; ++i) {
    const float* p = probs + i * sk;
    float* dp = dprobs + i * sk;
    float dot = 0.0f;
    for (std::int64_t j = 0; j < sk; ++j) dot += dp[j] * p[j];
    for (std::int64_t j = 0; j < sk; ++j) dp[j] = p[j] * (dp[j] - dot);
  }
}

}  // namespace

Support UnfusedAttention::check(const AttentionSpec& s) {
  Support sup;
  sup.require(s.dtype == DType::f32, ReasonCode::dtype,
              "dtype=" + std::string(to_string(s.dtype)) + " is not supported by the unfused baseline (f32 only)");
  sup.require(!s.varlen(), ReasonCode::varlen, "varlen (thd layout) is not supported by the unfused baseline");
  sup.require(!s.paged(), ReasonCode::layout, "paged K/V (a KV cache) is not supported by the unfused baseline");
  sup.require(!s.kv_quantized(), ReasonCode::kv_dtype,
              "kv_dtype=" + std::string(to_string(s.effective_kv_dtype())) +
                  ": 8-bit K/V are not supported by the unfused baseline");
  sup.require(s.softcap == 0.0, ReasonCode::softcap, "softcap is not supported by the unfused baseline");
  sup.require(!s.alibi, ReasonCode::alibi, "alibi is not supported by the unfused baseline");
  sup.require(!s.has_bias, ReasonCode::bias, "bias is not supported by the unfused baseline");
  sup.require(s.dropout_p == 0.0, ReasonCode::dropout, "dropout is not supported by the unfused baseline");
  return sup;
}

UnfusedAttention::UnfusedAttention(const AttentionSpec& spec) : spec_(spec) {
  validate(spec_);
  const Support sup = check(spec_);
  if (!sup.ok()) {
    throw Error(ErrorCode::unsupported, "spec", describe(spec_), sup.to_string());
  }
  to_blas(spec_.seqlen_q * spec_.seqlen_kv, "seqlen_q*seqlen_kv");
  threads_ = std::max(1, omp_get_max_threads());
}

float* UnfusedAttention::buffer(Tensor& buf, std::size_t need, const char* what) {
  if (static_cast<std::size_t>(buf.numel()) < need) {
    buf = Tensor();
    try {
      // Uninitialised: every element is written before it is read.
      const std::int64_t shape[] = {static_cast<std::int64_t>(need)};
      buf = Tensor::empty(DType::f32, shape, Device::cpu(), host_allocator());
    } catch (const Error&) {
      throw Error(ErrorCode::out_of_memory, what, std::to_string(need * sizeof(float)) + " bytes",
                  "the unfused baseline could not allocate its buffer");
    }
  }
  return buf.as<float>();
}

std::size_t UnfusedAttention::extra_bytes(Pass pass) const {
  const auto head = static_cast<std::size_t>(spec_.seqlen_q * spec_.seqlen_kv) * sizeof(float);
  const auto per_thread = head * static_cast<std::size_t>(threads_);
  if (pass == Pass::forward) return per_thread;
  return head * static_cast<std::size_t>(spec_.batch * spec_.heads_q) + per_thread;
}

void UnfusedAttention::forward(const Inputs& in, const TensorView& out, bool keep_probs) {
  const AttentionSpec& s = spec_;
  validate_inputs(s, in);
  require_like(out, out_like(in.q, s.head_dim_v), "out");
  check_rows(in.q, s.layout, "q");
  check_rows(in.k, s.layout, "k");
  check_rows(in.v, s.layout, "v");
  check_rows(out, s.layout, "out");
  const std::int64_t sq = s.seqlen_q, sk = s.seqlen_kv, head_elems = sq * sk;
  const std::int64_t heads = s.batch * s.heads_q;
  const std::size_t slots = keep_probs ? static_cast<std::size_t>(heads) : static_cast<std::size_t>(threads_);
  float* probs = keep_probs ? buffer(probs_, slots * static_cast<std::size_t>(head_elems), "probs")
                            : buffer(scores_, slots * static_cast<std::size_t>(head_elems), "scores");
  have_probs_ = false;
  const blasint m = to_blas(sq, "seqlen_q"), n = to_blas(sk, "seqlen_kv");
  const blasint dqk = to_blas(s.head_dim_qk, "head_dim_qk"), dv = to_blas(s.head_dim_v, "head_dim_v");
  const auto scale = static_cast<float>(s.effective_scale());
  const SerialBlas serial;
#pragma omp parallel for schedule(dynamic) num_threads(threads_)
  for (std::int64_t bh = 0; bh < heads; ++bh) {
    const std::int64_t b = bh / s.heads_q, h = bh % s.heads_q, hk = h / s.group_size();
    const Mat q = head(in.q, s.layout, b, h), k = head(in.k, s.layout, b, hk), v = head(in.v, s.layout, b, hk);
    const Mat o = head(out, s.layout, b, h);
    float* p = probs + (keep_probs ? bh : omp_get_thread_num()) * head_elems;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, dqk, scale, q.p, q.ld, k.p, k.ld, 0.0f, p, n);
    mask_and_softmax(s, p, sq, sk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dv, n, 1.0f, p, n, v.p, v.ld, 0.0f, o.p, o.ld);
  }
  have_probs_ = keep_probs;
}

void UnfusedAttention::backward(const Inputs& in, const TensorView& dout, const TensorView& dq,
                                const TensorView& dk, const TensorView& dv_t) {
  const AttentionSpec& s = spec_;
  if (!have_probs_) {
    throw Error(ErrorCode::bad_state, "probs", "not kept",
                "the unfused backward needs a preceding forward with keep_probs = true");
  }
  validate_inputs(s, in);
  require_like(dout, out_like(in.q, s.head_dim_v), "dout");
  require_like(dq, in.q, "dq");
  require_like(dk, in.k, "dk");
  require_like(dv_t, in.v, "dv");
  for (const auto& [t, name] : {std::pair{in.q, "q"}, {in.k, "k"}, {in.v, "v"}, {dout, "dout"}, {dq, "dq"},
                                {dk, "dk"}, {dv_t, "dv"}}) {
    check_rows(t, s.layout, name);
  }
  const std::int64_t sq = s.seqlen_q, sk = s.seqlen_kv, head_elems = sq * sk;
  float* dprobs = buffer(dprobs_, static_cast<std::size_t>(threads_ * head_elems), "dprobs");
  const blasint m = to_blas(sq, "seqlen_q"), n = to_blas(sk, "seqlen_kv");
  const blasint dqk = to_blas(s.head_dim_qk, "head_dim_qk"), dv = to_blas(s.head_dim_v, "head_dim_v");
  const auto scale = static_cast<float>(s.effective_scale());
  const std::int64_t group = s.group_size(), kv_heads = s.batch * s.heads_kv;
  const SerialBlas serial;
  // One task per (batch, kv head): the query heads of a GQA group accumulate
  // into the same dK/dV, so they run in order inside one task.
#pragma omp parallel for schedule(dynamic) num_threads(threads_)
  for (std::int64_t bk = 0; bk < kv_heads; ++bk) {
    const std::int64_t b = bk / s.heads_kv, hk = bk % s.heads_kv;
    float* dp = dprobs + omp_get_thread_num() * head_elems;
    const Mat k = head(in.k, s.layout, b, hk), v = head(in.v, s.layout, b, hk);
    const Mat k_grad = head(dk, s.layout, b, hk), v_grad = head(dv_t, s.layout, b, hk);
    for (std::int64_t g = 0; g < group; ++g) {
      const std::int64_t h = hk * group + g;
      const float beta = g == 0 ? 0.0f : 1.0f;  // the group's first head overwrites dK/dV
      const Mat q = head(in.q, s.layout, b, h), o_grad = head(dout, s.layout, b, h), q_grad = head(dq, s.layout, b, h);
      const float* p = probs_.as<float>() + (b * s.heads_q + h) * head_elems;
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, dv, m, 1.0f, p, n, o_grad.p, o_grad.ld, beta,
                  v_grad.p, v_grad.ld);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, dv, 1.0f, o_grad.p, o_grad.ld, v.p, v.ld, 0.0f,
                  dp, n);
      softmax_backward(p, dp, sq, sk);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dqk, n, scale, dp, n, k.p, k.ld, 0.0f, q_grad.p,
                  q_grad.ld);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, dqk, m, scale, dp, n, q.p, q.ld, beta, k_grad.p,
                  k_grad.ld);
    }
  }
}

}  // namespace attend::bench
