// Exact FLOP counts of attention, from the number of visible (query, key) pairs.
//
// Per visible pair and query head, forward does q.k (2*Dqk) and p*v (2*Dv);
// backward recomputes q.k and does dp = dout.v (2*Dv), dv += p*dout (2*Dv),
// dq += ds*k and dk += ds*q (2*Dqk each): 2*(3*Dqk + 2*Dv). For Dqk = Dv = D and
// no mask that is the familiar 4*Sq*Sk*D forward and 10*Sq*Sk*D backward; a
// causal square problem sees (S+1)/(2S) of the pairs. Softmax, scaling and
// masking are not counted (the convention of FlashAttention's benchmarks).
#pragma once

#include <cstdint>

#include "attend/backend.h"
#include "attend/spec.h"

namespace attend::detail {

// Visible pairs of one sequence with sq queries and sk keys under spec's mask.
std::int64_t visible_pairs(const AttentionSpec& spec, std::int64_t sq, std::int64_t sk);

// Visible pairs of the whole batch (one head). Dense layouts: batch * pairs(Sq, Sk).
// Varlen: summed over the sequences of in.cu_seqlens_q / cu_seqlens_kv (i32).
std::int64_t visible_pairs(const AttentionSpec& spec, const Inputs& in);

// FLOPs over all query heads for `pairs` visible pairs (from visible_pairs).
// Throw attend::Error(overflow) when the count does not fit in int64.
std::int64_t forward_flops(const AttentionSpec& spec, std::int64_t pairs);
std::int64_t backward_flops(const AttentionSpec& spec, std::int64_t pairs);

}  // namespace attend::detail
