// One row of the kernel-vs-reference suites (flash, decode): sizes and every
// feature switch, and the AttentionSpec they describe.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "attend/spec.h"

namespace attend::testing {

struct FeatureCase {
  std::string name;
  std::int64_t sq = 0, sk = 0, heads = 2, heads_kv = 2, dqk = 64, dv = 64;
  bool causal = false;
  std::int64_t wl = -1, wr = -1;
  double softcap = 0;
  std::optional<double> scale;  // default 1/sqrt(dqk)
  bool alibi = false, bias = false;
  double dropout = 0;
  Layout layout = Layout::bshd;
  std::vector<std::int32_t> lens_q, lens_kv;  // varlen when lens_q is non-empty; paged: stored lengths
  std::int64_t page = 0;                      // > 0: paged K/V with this page size
  std::vector<std::int32_t> leftpad;          // paged: per-sequence left padding
  SoftmaxType softmax = SoftmaxType::vanilla;  // attention sinks

  AttentionSpec spec(std::uint64_t dropout_seed) const {
    AttentionSpec s;
    s.seqlen_q = sq;
    s.seqlen_kv = sk;
    s.heads_q = heads;
    s.heads_kv = heads_kv;
    s.head_dim_qk = dqk;
    s.head_dim_v = dv;
    s.causal = causal;
    s.window_left = wl;
    s.window_right = wr;
    s.softcap = softcap;
    s.scale = scale;
    s.alibi = alibi;
    s.has_bias = bias;
    s.dropout_p = dropout;
    s.dropout_seed = dropout_seed;
    s.softmax_type = softmax;
    s.layout = (lens_q.empty() || page > 0) ? layout : Layout::thd;
    return s;
  }
};

inline FeatureCase make_case(std::string name, std::int64_t sq, std::int64_t sk, std::int64_t dqk, std::int64_t dv,
                             std::int64_t heads = 2, std::int64_t heads_kv = 2) {
  FeatureCase c;
  c.name = std::move(name);
  c.sq = sq;
  c.sk = sk;
  c.dqk = dqk;
  c.dv = dv;
  c.heads = heads;
  c.heads_kv = heads_kv;
  return c;
}

inline std::ostream& operator<<(std::ostream& os, const FeatureCase& c) { return os << c.name; }

}  // namespace attend::testing
