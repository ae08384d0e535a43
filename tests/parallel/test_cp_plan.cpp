// Context-parallel planning without any transport: strategy verdicts and
// fallback, forced strategies failing early with their reasons, the zigzag
// sharding and the ring schedule's coverage of every (query, key) pair.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "attend/error.h"
#include "attend/parallel.h"

namespace attend::parallel {
namespace {

AttentionSpec base_spec() {
  AttentionSpec s;
  s.batch = 1;
  s.seqlen_q = s.seqlen_kv = 64;
  s.heads_q = 8;
  s.heads_kv = 4;
  s.head_dim_qk = s.head_dim_v = 32;
  return s;
}

const StrategyVerdict& verdict(const Plan& p, Strategy s) {
  for (const StrategyVerdict& v : p.verdicts) {
    if (v.strategy == s) return v;
  }
  throw std::logic_error("no verdict");
}

bool has_reason(const StrategyVerdict& v, const std::string& needle) {
  for (const std::string& r : v.reasons) {
    if (r.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(CpPlan, AutoPrefersRingAndBothStrategiesAcceptAPlainProblem) {
  const Plan p = evaluate(base_spec(), Mode::training, {4, 1, Strategy::automatic});
  EXPECT_EQ(p.strategy, Strategy::ring);
  EXPECT_TRUE(verdict(p, Strategy::ring).chosen);
  EXPECT_TRUE(verdict(p, Strategy::a2a).accepted);
  EXPECT_FALSE(verdict(p, Strategy::a2a).chosen);
  EXPECT_FALSE(p.balanced);
  EXPECT_EQ(p.chunk_rows, 16);
  ASSERT_EQ(p.steps.size(), 4u);
  EXPECT_FALSE(verdict(p, Strategy::ring).backward_backend.empty());
}

TEST(CpPlan, AllToAllRejectedWhenHeadsDoNotSplitAndTheRingIsChosen) {
  AttentionSpec s = base_spec();
  s.heads_q = 6;
  s.heads_kv = 3;
  const Plan p = evaluate(s, Mode::training, {4, 0, Strategy::automatic});
  EXPECT_EQ(p.strategy, Strategy::ring);
  const StrategyVerdict& a = verdict(p, Strategy::a2a);
  EXPECT_FALSE(a.accepted);
  EXPECT_TRUE(has_reason(a, "heads_q=6 is not divisible by cp=4"));
  EXPECT_TRUE(has_reason(a, "heads_kv=3"));
  EXPECT_NE(p.explain().find("selected: ring"), std::string::npos);
}

TEST(CpPlan, ForcedStrategyThatCannotRunFailsEarlyWithItsReasons) {
  AttentionSpec s = base_spec();
  s.heads_q = 6;
  s.heads_kv = 3;
  try {
    plan(s, Mode::training, {4, 0, Strategy::a2a});
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_EQ(e.field(), "cp_strategy");
    EXPECT_EQ(e.value(), "a2a");
    EXPECT_NE(std::string(e.what()).find("heads_q=6 is not divisible by cp=4"), std::string::npos);
  }
  // Forcing never falls back: the ring is accepted but not chosen.
  const Plan p = evaluate(s, Mode::training, {4, 0, Strategy::a2a});
  EXPECT_FALSE(p.viable());
  EXPECT_TRUE(verdict(p, Strategy::ring).accepted);
  EXPECT_TRUE(verdict(p, Strategy::ring).not_forced);
}

TEST(CpPlan, DropoutRejectsAllToAllBecauseItsMaskIsKeyedByHead) {
  AttentionSpec s = base_spec();
  s.dropout_p = 0.1;
  const Plan p = evaluate(s, Mode::training, {2, 0, Strategy::automatic});
  EXPECT_TRUE(has_reason(verdict(p, Strategy::a2a), "dropout"));
  EXPECT_EQ(p.strategy, Strategy::ring);
}

TEST(CpPlan, VarlenBiasAndUnevenSequencesAreRejectedByEveryStrategy) {
  AttentionSpec s = base_spec();
  s.seqlen_q = s.seqlen_kv = 60;
  s.causal = true;  // 2*cp = 8 chunks: 60 does not split
  Plan p = evaluate(s, Mode::inference, {4, 0, Strategy::automatic});
  EXPECT_FALSE(p.viable());
  EXPECT_TRUE(has_reason(verdict(p, Strategy::ring), "not divisible by 8 chunks"));
  try {
    plan(s, Mode::inference, {4, 0, Strategy::automatic});
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "cp");
    EXPECT_NE(std::string(e.what()).find("selected: none"), std::string::npos);
  }
  AttentionSpec v = base_spec();
  v.layout = Layout::thd;
  v.total_q = v.total_kv = 64;
  p = evaluate(v, Mode::inference, {2, 0, Strategy::automatic});
  EXPECT_TRUE(has_reason(verdict(p, Strategy::ring), "varlen"));
  EXPECT_TRUE(has_reason(verdict(p, Strategy::a2a), "varlen"));
  AttentionSpec b = base_spec();
  b.has_bias = true;
  EXPECT_TRUE(has_reason(verdict(evaluate(b, Mode::inference, {2, 0}), Strategy::ring), "bias"));
}

// docs/semantics.md §1a: exactly one partial per query row carries the sink,
// the block against key chunk 0, which runs even when its keys are all masked.
TEST(CpPlan, SinksRideOnlyTheBlocksAgainstKeyChunkZeroWhichAreNeverSkipped) {
  for (const SoftmaxType t : {SoftmaxType::off_by_one, SoftmaxType::learnable}) {
    AttentionSpec s = base_spec();
    s.softmax_type = t;
    s.window_left = 8;  // far query chunks see nothing of chunk 0
    s.window_right = 0;
    const Plan a = evaluate(s, Mode::training, {2, 0, Strategy::automatic});
    EXPECT_TRUE(verdict(a, Strategy::ring).accepted) << a.explain();
    EXPECT_TRUE(verdict(a, Strategy::a2a).accepted) << a.explain();
    for (int rank = 0; rank < 4; ++rank) {
      const Plan p = evaluate(s, Mode::training, {4, rank, Strategy::ring});
      ASSERT_TRUE(p.viable()) << p.explain();
      int carriers = 0;
      for (const Step& step : p.steps) {
        for (const Block& b : step.blocks) {
          const AttentionSpec bs = block_spec(p, b, Pass::forward);
          if (b.kv_offset == 0) {
            ++carriers;
            EXPECT_NE(b.mask, BlockMask::skip) << "rank " << rank;
            EXPECT_EQ(bs.softmax_type, t);
          } else {
            EXPECT_EQ(bs.softmax_type, SoftmaxType::vanilla);
          }
        }
      }
      EXPECT_EQ(carriers, static_cast<int>(p.local_chunks().size())) << "one carrier per query chunk";
    }
  }
}

TEST(CpPlan, TrainingRejectsARingWhoseForcedBackendHasNoBackward) {
  Policy policy;
  policy.force = "decode";
  const Plan p = evaluate(base_spec(), Mode::training, {2, 0, Strategy::ring}, policy);
  EXPECT_FALSE(p.viable());
  const StrategyVerdict& r = verdict(p, Strategy::ring);
  EXPECT_TRUE(has_reason(r, "accumulating backward blocks"));
  EXPECT_TRUE(has_reason(r, "decode"));
}

TEST(CpPlan, BadConfigAndStrategyNamesAreErrorsNamingTheField) {
  try {
    parse_strategy("zigzag");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "cp_strategy");
    EXPECT_EQ(e.value(), "zigzag");
  }
  EXPECT_EQ(parse_strategy("a2a"), Strategy::a2a);
  try {
    evaluate(base_spec(), Mode::inference, {4, 4});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "cp_rank");
  }
  EXPECT_THROW(evaluate(base_spec(), Mode::inference, {0, 0}), Error);
}

// In the balanced layout every rank covers the same number of visible pairs,
// and the union of all ranks' blocks is every chunk pair exactly once.
TEST(CpPlan, ZigzagLayoutBalancesCausalWorkAndCoversEveryPairOnce) {
  AttentionSpec s = base_spec();
  s.causal = true;
  for (int n : {2, 3, 4}) {
    s.seqlen_q = s.seqlen_kv = 2 * n * 8;
    const Plan p0 = evaluate(s, Mode::training, {n, 0});
    ASSERT_TRUE(p0.balanced);
    std::set<std::pair<std::int64_t, std::int64_t>> seen;
    std::int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      const Plan p = evaluate(s, Mode::training, {n, r});
      const auto chunks = p.local_chunks();
      ASSERT_EQ(chunks.size(), 2u);
      EXPECT_EQ(chunks[0].index, r);
      EXPECT_EQ(chunks[1].index, 2 * n - 1 - r);
      EXPECT_EQ(p.visible_pairs(r), p0.visible_pairs(0)) << "cp=" << n << " rank " << r;
      total += p.visible_pairs(r);
      for (const Step& st : p.steps) {
        EXPECT_EQ(st.send_to, (r + 1) % n);
        EXPECT_EQ(st.recv_from, (r + n - 1) % n);
        EXPECT_EQ(st.kv_owner, (r - st.index + n) % n);
        for (const Block& b : st.blocks) {
          EXPECT_TRUE(seen.insert({b.q_offset, b.kv_offset}).second);
          // Causal: keys after the block's queries are skipped, the diagonal is masked.
          const BlockMask want = b.kv_offset > b.q_offset    ? BlockMask::skip
                                 : b.kv_offset == b.q_offset ? BlockMask::partial
                                                             : BlockMask::none;
          EXPECT_EQ(b.mask, want);
        }
      }
    }
    const std::int64_t S = s.seqlen_q, chunks = 2 * n;
    EXPECT_EQ(static_cast<std::int64_t>(seen.size()), chunks * chunks);
    EXPECT_EQ(total, S * (S + 1) / 2);
  }
}

TEST(CpPlan, SlidingWindowSkipsBlocksOutsideTheBand) {
  AttentionSpec s = base_spec();
  s.window_left = 10;
  s.window_right = 3;
  const Plan p = evaluate(s, Mode::inference, {4, 0});
  EXPECT_FALSE(p.balanced);
  int skipped = 0;
  for (const Step& st : p.steps) {
    for (const Block& b : st.blocks) skipped += b.mask == BlockMask::skip;
  }
  // Rank 0 (rows 0..15) sees keys up to 18: chunk 1 is masked, chunks 2 and 3 skipped.
  EXPECT_EQ(skipped, 2);
  std::int64_t pairs = 0;
  for (std::int64_t i = 0; i < 16; ++i) {
    for (std::int64_t j = 0; j < 64; ++j) pairs += j <= i + 3 && j >= i - 10;
  }
  EXPECT_EQ(p.visible_pairs(0), pairs);
}

TEST(CpPlan, BlockSpecsCarryOffsetsPartialsAndAccumulation) {
  AttentionSpec s = base_spec();
  s.causal = true;
  s.dtype = DType::bf16;
  const Plan p = evaluate(s, Mode::training, {2, 1});
  const Block unmasked{0, 0, 48, 0, BlockMask::none};
  const AttentionSpec f = block_spec(p, unmasked, Pass::forward);
  EXPECT_EQ(f.seqlen_q, 16);
  EXPECT_EQ(f.q_offset, 48);
  EXPECT_FALSE(f.causal);
  EXPECT_EQ(f.effective_out_dtype(), DType::f32);
  const AttentionSpec b = block_spec(p, {0, 0, 16, 16, BlockMask::partial}, Pass::backward);
  EXPECT_TRUE(b.causal);
  EXPECT_TRUE(b.accumulate_grads);
  EXPECT_EQ(a2a_spec(p).heads_q, 4);
  EXPECT_EQ(a2a_spec(p).heads_kv, 2);
  EXPECT_NE(p.to_json().find("\"strategy\": \"ring\""), std::string::npos);
}

}  // namespace
}  // namespace attend::parallel
