#include "backends/decode/decode_params.h"

#include <algorithm>
#include <limits>

#include "runtime/checked.h"

namespace attend::decode {

namespace {

// A split must be long enough that its fixed costs (loading the query rows,
// writing a partial, combining it) vanish next to streaming its keys, and there
// must be enough splits to keep every core busy on a single long sequence.
constexpr std::int64_t kMinSplitKeys = 256;
constexpr std::int64_t kMaxSplits = 64;

}  // namespace

// The plan is computed by the support check, before any size is validated
// against memory, so a huge varlen seqlen_q saturates rather than overflows:
// the saturated sizes then fail the scratch limit with a reason.
SplitPlan plan_splits(const AttentionSpec& s) {
  using detail::sat_add;
  using detail::sat_mul;
  SplitPlan p;
  const std::int64_t sk = std::max<std::int64_t>(s.seqlen_kv, 1);
  p.split_len = std::max(kMinSplitKeys, round_up((sk + kMaxSplits - 1) / kMaxSplits, kBlockN));
  p.max_splits = std::max<std::int64_t>(1, (sk + p.split_len - 1) / p.split_len);
  p.max_rows = sat_mul(s.group_size(), s.seqlen_q);
  p.dqkp = round_up(s.head_dim_qk, kPad);
  p.dvp = round_up(s.head_dim_v, kPad);
  // Scaled q rows, scores, output accumulators, running max and sum, and
  // the second level of the output and sum with its pending rescale.
  p.head_floats = sat_add(sat_mul(p.max_rows, p.dqkp + kBlockN + 2 * p.dvp + 4), 2 * kPad);
  // Heads per task while one head's working set is small (decode shapes): up to
  // all of them, within ~1 MiB of scratch.
  constexpr std::int64_t kChunkFloats = std::int64_t{1} << 18;
  p.head_chunk = std::clamp<std::int64_t>(kChunkFloats / std::max<std::int64_t>(p.head_floats, 1), 1, s.heads_kv);
  p.convert_offset = sat_mul(p.head_chunk, p.head_floats);
  p.scratch_floats = sat_add(p.convert_offset, sat_mul(kBlockN, p.dqkp + p.dvp));
  p.partial_floats = p.max_splits > 1
                         ? sat_mul(sat_mul(sat_mul(s.batch, s.heads_kv), p.max_splits), sat_mul(p.max_rows, p.dvp + 1))
                         : 0;
  return p;
}

DecodeParams make_params(const ForwardArgs& a) {
  const AttentionSpec& s = a.spec;
  const Inputs& in = a.in;
  DecodeParams p;
  detail::init_kernel_problem(p, s, in);
  p.plan = plan_splits(s);
  p.out = a.out.data;
  p.so = detail::token_strides(a.out, s.layout);
  p.lse = a.lse.as<float>();
  p.slse = detail::lse_strides(a.lse, s.layout);
  return p;
}

}  // namespace attend::decode
