// Test helpers for paged K/V: scatter a dense problem's keys into page pools
// (pages assigned in a shuffled order, so a kernel that ignores the block table
// reads the wrong keys).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "attend/attend.h"
#include "support/baseline.h"
#include "support/tensors.h"

namespace attend::testing {

struct PagedProblem {
  Problem dense;  // bshd, seqlen_kv = the longest stored length; its keys are the storage rows
  AttentionSpec spec;
  Tensor k_pool, v_pool, table, seqlens, leftpad;
  Inputs inputs;
};

// `s` must be bshd/bhsd/sbhd; lens[b] tokens are stored for sequence b, of which
// the first leftpad[b] are padding. The pool holds one spare page.
inline PagedProblem make_paged(AttentionSpec s, std::int64_t page, std::vector<std::int32_t> lens,
                               std::vector<std::int32_t> leftpad, std::uint64_t seed) {
  PagedProblem p;
  s.batch = static_cast<std::int64_t>(lens.size());
  if (leftpad.empty()) leftpad.assign(lens.size(), 0);
  const std::int64_t stored = std::max<std::int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  AttentionSpec dense_spec = s;
  dense_spec.layout = Layout::bshd;
  dense_spec.seqlen_kv = stored;
  dense_spec.has_bias = false;
  p.dense = make_problem(dense_spec, seed);
  const std::int64_t width = (stored + page - 1) / page, pages = s.batch * width + 1;
  std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed + 99));
  const std::int64_t hk = s.heads_kv, dqk = s.head_dim_qk, dv = s.head_dim_v;
  p.k_pool = Tensor::zeros(s.dtype, {pages, page, hk, dqk});
  p.v_pool = Tensor::zeros(s.dtype, {pages, page, hk, dv});
  p.table = Tensor::zeros(DType::i32, {s.batch, width});
  p.seqlens = Tensor::zeros(DType::i32, {s.batch});
  p.leftpad = Tensor::zeros(DType::i32, {s.batch});
  for (std::int64_t b = 0; b < s.batch; ++b) {
    p.seqlens.as<std::int32_t>()[b] = lens[b];
    p.leftpad.as<std::int32_t>()[b] = leftpad[b];
    for (std::int64_t w = 0; w < width; ++w) p.table.as<std::int32_t>()[b * width + w] = order[b * width + w];
    for (std::int64_t t = 0; t < stored; ++t) {
      const std::int64_t row = order[b * width + t / page] * page + t % page;
      std::copy_n(p.dense.k.as<float>() + (b * stored + t) * hk * dqk, hk * dqk, p.k_pool.as<float>() + row * hk * dqk);
      std::copy_n(p.dense.v.as<float>() + (b * stored + t) * hk * dv, hk * dv, p.v_pool.as<float>() + row * hk * dv);
    }
  }
  s.kv_page_size = page;
  s.kv_leftpad = std::any_of(leftpad.begin(), leftpad.end(), [](std::int32_t x) { return x > 0; });
  s.seqlen_kv = 0;
  for (std::size_t b = 0; b < lens.size(); ++b) s.seqlen_kv = std::max<std::int64_t>(s.seqlen_kv, lens[b] - leftpad[b]);
  // q (and bias, slopes) in the requested layout.
  AttentionSpec qspec = s;
  qspec.kv_page_size = 0;
  qspec.kv_leftpad = false;
  const Problem qp = make_problem(qspec, seed + 7);
  p.dense.q = qp.q;
  p.dense.dout = qp.dout;
  p.inputs.q = qp.q;
  p.inputs.k = p.k_pool;
  p.inputs.v = p.v_pool;
  p.inputs.block_table = p.table;
  p.inputs.cache_seqlens = p.seqlens;
  if (s.kv_leftpad) p.inputs.cache_leftpad = p.leftpad;
  p.dense.bias = qp.bias;
  p.inputs.bias = qp.bias;
  p.dense.slopes = qp.slopes;
  p.inputs.alibi_slopes = qp.slopes;
  p.dense.sinks = qp.sinks;
  p.inputs.sinks = qp.sinks;
  p.spec = s;
  return p;
}

// The same paged problem in f64 (page pools converted; index tensors shared).
inline Problem paged_as_f64(const PagedProblem& p) {
  Problem d;
  d.spec = p.spec;
  d.spec.dtype = DType::f64;
  d.q = to_f64(p.dense.q);
  d.k = to_f64(p.k_pool);
  d.v = to_f64(p.v_pool);
  d.bias = to_f64(p.dense.bias);
  d.slopes = p.dense.slopes;
  d.inputs = p.inputs;
  d.inputs.q = d.q;
  d.inputs.k = d.k;
  d.inputs.v = d.v;
  if (d.bias.defined()) d.inputs.bias = d.bias;
  d.sinks = to_f64(p.dense.sinks);
  if (d.sinks.defined()) d.inputs.sinks = d.sinks;
  return d;
}

inline Problem paged_as_problem(const PagedProblem& p) {
  Problem d;
  d.spec = p.spec;
  d.q = p.dense.q;
  d.k = p.k_pool;
  d.v = p.v_pool;
  d.bias = p.dense.bias;
  d.slopes = p.dense.slopes;
  d.dout = p.dense.dout;
  d.sinks = p.dense.sinks;
  d.inputs = p.inputs;
  return d;
}

}  // namespace attend::testing
