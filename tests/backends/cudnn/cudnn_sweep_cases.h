// The rule-vs-engine sweep's grid, shared by the on-device sweep
// (test_cudnn_device.cpp) and the deviceless one (test_cudnn_deviceless.cpp)
// so a GPU session compares the two verdicts case by case: dtypes x head dims
// x masks/bias/varlen/paged/sinks/deterministic x (MHA, GQA).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attend/spec.h"
#include "backends/cudnn/cudnn_test_spec.h"

namespace attend::testing {

struct SweepCase {
  std::string name;
  AttentionSpec spec;
};

// wide: the deviceless grid (8 head dims x 12 features; cuDNN answers in
// milliseconds); narrow: the on-device one (6 x 7; a device also builds each
// plan, compiling kernels for seconds).
inline std::vector<SweepCase> cudnn_sweep_cases(std::vector<DType> dtypes, bool wide) {
  std::vector<SweepCase> cases;
  using Dims = std::pair<std::int64_t, std::int64_t>;
  const std::vector<Dims> dims =
      wide
          ? std::vector<Dims>{{64, 64}, {96, 96}, {128, 128}, {160, 160}, {192, 128}, {256, 256}, {64, 512}, {576, 512}}
          : std::vector<Dims>{{64, 64}, {128, 128}, {192, 128}, {256, 256}, {64, 512}, {576, 512}};
  const std::vector<std::string> features =
      wide
          ? std::vector<std::string>{"plain",  "causal", "window",       "window_causal", "bias",       "bias_causal",
                                     "varlen", "paged",  "causal_sq<sk", "sinks",         "off_by_one", "deterministic"}
          : std::vector<std::string>{"plain", "causal", "window", "bias", "varlen", "paged", "causal_sq<sk"};
  for (DType dt : dtypes) {
    for (const auto& [dqk, dv] : dims) {
      for (const std::string& feature : features) {
        for (std::int64_t kv : {8, 2}) {
          AttentionSpec s = cudnn_spec(dqk, dv, 256, 8);
          s.dtype = dt;
          s.heads_kv = kv;
          if (feature == "causal" || feature == "window_causal" || feature == "bias_causal" || feature == "sinks")
            s.causal = true;
          if (feature == "window" || feature == "window_causal") s.window_left = 64;
          if (feature == "bias" || feature == "bias_causal") s.has_bias = true;
          if (feature == "causal_sq<sk") {
            s.causal = true;
            s.seqlen_q = 128;
          }
          if (feature == "varlen") {
            s.layout = Layout::thd;
            s.causal = true;
            s.total_q = s.total_kv = s.batch * s.seqlen_q;
          }
          if (feature == "paged") {
            s.seqlen_q = 1;
            s.kv_page_size = 64;
          }
          if (feature == "sinks") s.softmax_type = SoftmaxType::learnable;
          if (feature == "off_by_one") s.softmax_type = SoftmaxType::off_by_one;
          if (feature == "deterministic") s.deterministic = true;
          const std::string name = std::string(to_string(dt)) + " d=" + std::to_string(dqk) + "/" + std::to_string(dv) +
                                   " " + feature + (kv == 8 ? "" : " gqa");
          cases.push_back({name, s});
        }
      }
    }
  }
  return cases;
}

}  // namespace attend::testing
