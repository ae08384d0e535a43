// The problem the cudnn tests vary: bf16, B=2, square, no mask.
#pragma once

#include <cstdint>

#include "attend/spec.h"

namespace attend::testing {

inline AttentionSpec cudnn_spec(std::int64_t dqk, std::int64_t dv, std::int64_t seqlen, std::int64_t heads) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = s.seqlen_kv = seqlen;
  s.heads_q = s.heads_kv = heads;
  s.head_dim_qk = dqk;
  s.head_dim_v = dv;
  s.dtype = DType::bf16;
  return s;
}

}  // namespace attend::testing
