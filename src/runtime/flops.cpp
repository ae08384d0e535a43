#include "runtime/flops.h"

#include <algorithm>
#include <string>

#include "attend/error.h"
#include "kernel/layout.h"
#include "kernel/semantics.h"
#include "runtime/checked.h"

namespace attend::detail {

std::int64_t visible_pairs(const AttentionSpec& spec, std::int64_t sq, std::int64_t sk) {
  // One pass over the rows: visible_keys is the single definition of the mask,
  // so the count cannot drift from what the kernels compute.
  std::int64_t pairs = 0;
  for (std::int64_t i = 0; i < sq; ++i) {
    const KeyRange r = visible_keys(spec, i, sq, sk);
    if (!r.empty()) pairs += r.end - r.begin;
  }
  return pairs;
}

std::int64_t visible_pairs(const AttentionSpec& spec, const Inputs& in) {
  if (spec.paged()) {
    // The lengths live in cache_seqlens: without it there is nothing to count.
    if (in.cache_seqlens.as<const std::int32_t>() == nullptr || in.cache_seqlens.dtype != DType::i32 ||
        in.cache_seqlens.numel() < spec.batch || (spec.kv_leftpad && in.cache_leftpad.numel() < spec.batch)) {
      throw Error(ErrorCode::invalid_argument, "cache_seqlens", "missing",
                  "paged FLOP counts need i32 cache_seqlens (and cache_leftpad with kv_leftpad) of batch entries");
    }
    std::int64_t total = 0;
    for (std::int64_t b = 0; b < spec.batch; ++b) {
      const SeqSpan sp = sequence_span(spec, in, b);
      total = checked_add(total, visible_pairs(spec, sp.q_len, std::max<std::int64_t>(sp.kv_len, 0)), "visible pairs");
    }
    return total;
  }
  if (!spec.varlen()) {
    return checked_mul(spec.batch, visible_pairs(spec, spec.seqlen_q, spec.seqlen_kv), "visible pairs");
  }
  const auto* cq = in.cu_seqlens_q.as<const std::int32_t>();
  const auto* ck = in.cu_seqlens_kv.as<const std::int32_t>();
  if (cq == nullptr || ck == nullptr || in.cu_seqlens_q.dtype != DType::i32 || in.cu_seqlens_kv.dtype != DType::i32 ||
      in.cu_seqlens_q.numel() < spec.batch + 1 || in.cu_seqlens_kv.numel() < spec.batch + 1) {
    throw Error(ErrorCode::invalid_argument, "cu_seqlens", "missing",
                "varlen FLOP counts need i32 cu_seqlens_q and cu_seqlens_kv of batch+1 entries");
  }
  std::int64_t total = 0;
  for (std::int64_t b = 0; b < spec.batch; ++b) {
    const std::int64_t sq = std::int64_t{cq[b + 1]} - cq[b];
    const std::int64_t sk = std::int64_t{ck[b + 1]} - ck[b];
    total = checked_add(total, visible_pairs(spec, std::max<std::int64_t>(sq, 0), std::max<std::int64_t>(sk, 0)),
                        "visible pairs");
  }
  return total;
}

std::int64_t forward_flops(const AttentionSpec& spec, std::int64_t pairs) {
  const std::int64_t per_pair = 2 * (spec.head_dim_qk + spec.head_dim_v);
  return checked_mul(checked_mul(pairs, spec.heads_q, "forward flops"), per_pair, "forward flops");
}

std::int64_t backward_flops(const AttentionSpec& spec, std::int64_t pairs) {
  const std::int64_t per_pair = 2 * (3 * spec.head_dim_qk + 2 * spec.head_dim_v);
  return checked_mul(checked_mul(pairs, spec.heads_q, "backward flops"), per_pair, "backward flops");
}

}  // namespace attend::detail
