// The conformance suite's feature cases (tests/conformance), shared with the
// device backends' suites, which run the same cases on their own memory.
#pragma once

#include <vector>

#include "attend/spec.h"
#include "support/feature_case.h"

namespace attend::testing {

inline std::vector<FeatureCase> conformance_cases() {
  std::vector<FeatureCase> v;
  v.push_back(make_case("plain_37x53", 37, 53, 32, 32));
  v.push_back(make_case("single_key", 9, 1, 16, 16));
  v.push_back(make_case("mla_192_128", 21, 40, 192, 128));
  v.push_back(make_case("v_wider_48_96", 19, 33, 48, 96));
  FeatureCase c = make_case("causal_gqa", 45, 45, 32, 32, 4, 2);
  c.causal = true;
  v.push_back(c);
  c = make_case("causal_sq_below_sk_mqa", 7, 61, 32, 32, 4, 1);
  c.causal = true;
  v.push_back(c);
  c = make_case("window_softcap", 40, 52, 32, 32);
  c.wl = 9;
  c.wr = 3;
  c.softcap = 8;
  v.push_back(c);
  c = make_case("alibi_bias", 29, 31, 32, 32);
  c.alibi = c.bias = true;
  v.push_back(c);
  c = make_case("dropout_causal", 33, 33, 32, 32);
  c.dropout = 0.25;
  c.causal = true;
  v.push_back(c);
  c = make_case("varlen_empty_gqa", 0, 0, 32, 32, 4, 2);
  c.lens_q = {5, 0, 17};
  c.lens_kv = {9, 3, 17};
  c.causal = true;
  v.push_back(c);
  c = make_case("bhsd_layout", 17, 23, 32, 32);
  c.layout = Layout::bhsd;
  v.push_back(c);
  // Attention sinks: an implicit logit 0, and learned per-head logits with
  // their gradient, over masks that leave rows empty and GQA groups.
  c = make_case("sink_off_by_one_causal", 31, 20, 32, 32, 4, 2);
  c.causal = true;
  c.softmax = SoftmaxType::off_by_one;
  v.push_back(c);
  c = make_case("sink_learnable_window_softcap_mqa", 40, 52, 32, 32, 4, 1);
  c.wl = 9;
  c.wr = 3;
  c.softcap = 8;
  c.softmax = SoftmaxType::learnable;
  v.push_back(c);
  c = make_case("sink_learnable_varlen", 0, 0, 32, 32, 4, 2);
  c.lens_q = {5, 0, 17};
  c.lens_kv = {9, 3, 17};
  c.causal = true;
  c.softmax = SoftmaxType::learnable;
  v.push_back(c);
  return v;
}

// A case as a partial problem: the same rows at global offsets.
inline AttentionSpec with_offsets(AttentionSpec s) {
  s.q_offset = 48;
  s.kv_offset = 40;
  return s;
}

}  // namespace attend::testing
