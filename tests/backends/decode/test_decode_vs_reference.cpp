// decode (f32) against the f64 reference on dense, varlen and paged problems,
// with FlashAttention's same-precision-baseline rule (docs/semantics.md §7).
#include <gtest/gtest.h>

#include <omp.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/decode.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"
#include "backends/decode/paged_problem.h"
#include "support/feature_case.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::PassResults;

using DecodeCase = testing::FeatureCase;

// Decode's cases: GQA 4/2 unless a case says otherwise.
DecodeCase make(std::string name, std::int64_t sq, std::int64_t sk, std::int64_t dqk, std::int64_t dv) {
  return testing::make_case(std::move(name), sq, sk, dqk, dv, 4, 2);
}

AttentionSpec spec_of(const DecodeCase& c) { return c.spec(77); }

class DecodeVsReference : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeVsReference, ForwardWithinSamePrecisionBaseline) {
  const DecodeCase& c = GetParam();
  testing::Problem p32, p64;
  testing::PagedProblem pp;  // owns the block table and lengths the inputs view
  if (c.page > 0) {
    pp = testing::make_paged(spec_of(c), c.page, c.lens_kv, c.leftpad, 5);
    p32 = testing::paged_as_problem(pp);
    p64 = testing::paged_as_f64(pp);
  } else {
    p32 = testing::make_problem(spec_of(c), 5, c.lens_q, c.lens_kv);
    p64 = testing::problem_as_f64(p32);
  }
  const auto decode = make_decode_backend();
  ASSERT_TRUE(decode->check(p32.spec, Pass::forward).ok()) << decode->check(p32.spec, Pass::forward).to_string();
  const PassResults got = testing::run_backend(*decode, p32, false);
  const PassResults naive = testing::run_backend(*make_reference_backend({.accumulate_f64 = false}), p32, false);
  const PassResults ref = testing::run_backend(*make_reference_backend(), p64, false);
  testing::expect_within_baseline("out", got.out, naive.out, ref.out, 2);
  testing::expect_within_baseline("lse", got.lse, naive.lse, ref.lse, 2);
  if (c.page > 0) {  // flash's prefill path reads the same paged cache
    const PassResults fl = testing::run_backend(*make_flash_backend(), p32, false);
    testing::expect_within_baseline("flash out", fl.out, naive.out, ref.out, 2);
    testing::expect_within_baseline("flash lse", fl.lse, naive.lse, ref.lse, 2);
  }
}

std::vector<DecodeCase> cases() {
  std::vector<DecodeCase> v;
  v.push_back(make("single_query_one_split", 1, 200, 64, 64));
  v.push_back(make("single_query_many_splits", 1, 2100, 64, 64));  // 9 splits of 256 keys
  v.push_back(make("one_key", 1, 1, 64, 64));
  v.push_back(make("no_keys", 2, 0, 32, 32));
  v.push_back(make("mla_192_128", 1, 700, 192, 128));
  v.push_back(make("d64_v512", 1, 700, 64, 512));
  v.push_back(make("odd_dims_59_111", 3, 333, 59, 111));
  v.push_back(make("sixteen_queries", 16, 600, 64, 64));
  auto c = make("causal_sq4", 4, 530, 64, 64);
  c.causal = true;
  v.push_back(c);
  c = make("causal_sq_above_sk_empty_rows", 6, 3, 32, 32);
  c.causal = true;
  v.push_back(c);
  c = make("sliding_window", 3, 900, 64, 64);
  c.causal = true;
  c.wl = 100;
  v.push_back(c);
  c = make("window_both_sides", 5, 400, 32, 48);
  c.wl = 30;
  c.wr = 7;
  v.push_back(c);
  c = make("softcap", 2, 500, 64, 64);
  c.softcap = 5;
  v.push_back(c);
  c = make("alibi_causal", 3, 520, 64, 64);
  c.alibi = true;
  c.causal = true;
  v.push_back(c);
  c = make("bias", 2, 300, 64, 64);
  c.bias = true;
  v.push_back(c);
  c = make("dropout", 2, 600, 64, 64);
  c.dropout = 0.2;
  v.push_back(c);
  c = make("gqa_32_8", 1, 600, 128, 128);
  c.heads = 32;
  c.heads_kv = 8;
  v.push_back(c);
  c = make("mqa_8_1", 2, 300, 64, 64);
  c.heads = 8;
  c.heads_kv = 1;
  v.push_back(c);
  c = make("layout_bhsd", 2, 300, 64, 64);
  c.layout = Layout::bhsd;
  v.push_back(c);
  c = make("layout_sbhd", 2, 300, 64, 64);
  c.layout = Layout::sbhd;
  c.causal = true;
  v.push_back(c);
  c = make("varlen_with_empty", 0, 0, 64, 64);
  c.lens_q = {1, 0, 3, 2};
  c.lens_kv = {700, 50, 0, 300};
  c.causal = true;
  v.push_back(c);
  // Absorbed MLA on a paged cache: decode, and flash's prefill path on the same pages.
  c = make("paged_mla_absorbed_576_512_mqa", 2, 0, 576, 512);
  c.heads = 8;
  c.heads_kv = 1;
  c.page = 64;
  c.lens_kv = {300, 70};
  c.causal = true;
  v.push_back(c);
  // Attention sinks: added once per row, whether the row's keys ran as one
  // split or many (the split combine takes the sink as one more part).
  c = make("sinks_learnable_one_split", 1, 200, 64, 64);
  c.softmax = SoftmaxType::learnable;
  v.push_back(c);
  c = make("sinks_learnable_many_splits_causal", 3, 2100, 64, 64);
  c.causal = true;
  c.softmax = SoftmaxType::learnable;
  v.push_back(c);
  c = make("sinks_off_by_one_mqa_empty_rows", 6, 3, 32, 32);
  c.heads = 8;
  c.heads_kv = 1;
  c.causal = true;
  c.softmax = SoftmaxType::off_by_one;
  v.push_back(c);
  c = make("sinks_learnable_varlen_softcap", 0, 0, 64, 64);
  c.lens_q = {1, 0, 3, 2};
  c.lens_kv = {700, 50, 0, 300};
  c.softcap = 5;
  c.softmax = SoftmaxType::learnable;
  v.push_back(c);
  c = make("sinks_learnable_paged_p16", 2, 0, 64, 64);
  c.page = 16;
  c.lens_kv = {700, 33, 1};
  c.causal = true;
  c.softmax = SoftmaxType::learnable;
  v.push_back(c);
  // Paged: pages shuffled; page sizes 1, 16, 64; left padding; prefill-sized too.
  c = make("paged_p16", 1, 0, 64, 64);
  c.page = 16;
  c.lens_kv = {700, 33, 1};
  v.push_back(c);
  c = make("paged_p1_gqa", 2, 0, 32, 32);
  c.page = 1;
  c.heads = 4;
  c.heads_kv = 1;
  c.lens_kv = {90, 17};
  c.causal = true;
  v.push_back(c);
  c = make("paged_leftpad_alibi_window", 3, 0, 64, 64);
  c.page = 64;
  c.lens_kv = {600, 130, 70};
  c.leftpad = {0, 45, 70};  // the last sequence is all padding: empty rows
  c.causal = true;
  c.wl = 200;
  c.alibi = true;
  v.push_back(c);
  c = make("paged_mla_192_128_bhsd", 1, 0, 192, 128);
  c.page = 32;
  c.lens_kv = {500, 260};
  c.layout = Layout::bhsd;
  v.push_back(c);
  c = make("paged_d64_v512_softcap", 2, 0, 64, 512);
  c.page = 8;
  c.lens_kv = {300, 41};
  c.softcap = 10;
  c.causal = true;
  v.push_back(c);
  // Query rows per kv head (group * seqlen_q) that leave every remainder of
  // the kernels' 4-row passes, with head dims off the vector widths (16, 8);
  // causal cases put rows that see part of a key block beside rows that see all of it.
  const auto rows = [&](std::string name, std::int64_t heads, std::int64_t heads_kv, std::int64_t sq, std::int64_t sk,
                        std::int64_t dqk, std::int64_t dv, bool causal) {
    DecodeCase r = make(std::move(name), sq, sk, dqk, dv);
    r.heads = heads;
    r.heads_kv = heads_kv;
    r.causal = causal;
    v.push_back(r);
  };
  rows("rows_1_d72_40", 2, 2, 1, 700, 72, 40, false);
  rows("rows_2_d24_136_causal", 2, 2, 2, 530, 24, 136, true);
  rows("rows_3_d100_72", 6, 2, 1, 600, 100, 72, false);
  rows("rows_5_d80_48_causal", 2, 2, 5, 530, 80, 48, true);
  rows("rows_7_d40_24", 7, 1, 1, 900, 40, 24, false);
  rows("rows_9_d100_72_causal", 6, 2, 3, 1100, 100, 72, true);
  rows("rows_14_d8_8_causal", 14, 2, 2, 300, 8, 8, true);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeVsReference, ::testing::ValuesIn(cases()), [](const auto& param_info) {
  return param_info.param.name;
});

TEST(DecodeBehaviour, ResultIsBitwiseIdenticalForAnyThreadCount) {
  AttentionSpec s = spec_of(make("t", 2, 3000, 64, 64));
  s.causal = true;
  const testing::Problem p = testing::make_problem(s, 8);
  const auto decode = make_decode_backend();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const PassResults one = testing::run_backend(*decode, p, false);
  omp_set_num_threads(3);
  const PassResults three = testing::run_backend(*decode, p, false);
  omp_set_num_threads(saved);
  EXPECT_TRUE(testing::bitwise_equal(one.out, three.out));
  EXPECT_TRUE(testing::bitwise_equal(one.lse, three.lse));
}

TEST(DecodeBehaviour, CheckDeclinesBackwardAndOtherDtypesButOnlyDefersOnLongQueryBlocks) {
  const auto decode = make_decode_backend();
  AttentionSpec s = spec_of(make("t", 1, 100, 64, 64));
  const Support bwd = decode->check(s, Pass::backward);
  ASSERT_FALSE(bwd.ok());
  EXPECT_EQ(bwd.reasons[0].code, ReasonCode::no_backward);
  EXPECT_NE(bwd.to_string().find("no backward"), std::string::npos);
  s.seqlen_q = kDecodeMaxSeqlenQ;
  EXPECT_FALSE(decode->defers(s, Mode::inference, {}));
  s.seqlen_q = kDecodeMaxSeqlenQ + 1;
  EXPECT_TRUE(decode->check(s, Pass::forward).ok()) << decode->check(s, Pass::forward).to_string();
  std::string why;
  EXPECT_TRUE(decode->defers(s, Mode::inference, {}, &why));
  EXPECT_NE(why.find("seqlen_q=17 is above decode's crossover 16"), std::string::npos) << why;
  s.seqlen_q = 1;
  s.dtype = DType::f64;
  EXPECT_EQ(decode->check(s, Pass::forward).reasons.at(0).code, ReasonCode::dtype);
}

TEST(DecodeBehaviour, CallingBackwardDirectlyIsAnErrorNotACrash) {
  const testing::Problem p = testing::make_problem(spec_of(make("t", 1, 50, 16, 16)), 3);
  EXPECT_THROW((void)testing::run_backend(*make_decode_backend(), p, true), Error);
}

}  // namespace
}  // namespace attend
