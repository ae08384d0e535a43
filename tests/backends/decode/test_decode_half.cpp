// decode on bf16/f16 inputs: against the f64 reference with the §3.3
// same-precision-baseline rule, and — on the conversion paths — exactly the f32
// kernel's result on the widened inputs (loads widen exactly; all math is f32),
// for dense, varlen and paged caches, under every forced ISA. The avx512bf16
// family's bf16 scores take vdpbf16ps on the unscaled query (the scale
// multiplies the sums), so there only the baseline holds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/decode.h"
#include "attend/backends/flash.h"
#include "backends/decode/paged_problem.h"
#include "support/half_baseline.h"
#include "support/tensors.h"

namespace attend {
namespace {

struct HalfCase {
  std::string name;
  AttentionSpec spec;
  std::vector<std::int32_t> lens_q, lens_kv;
  std::int64_t page = 0;
};

std::ostream& operator<<(std::ostream& os, const HalfCase& c) { return os << c.name; }

AttentionSpec base(std::int64_t sq, std::int64_t sk, std::int64_t dqk, std::int64_t dv) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = sq;
  s.seqlen_kv = sk;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = dqk;
  s.head_dim_v = dv;
  return s;
}

std::vector<HalfCase> cases() {
  std::vector<HalfCase> v;
  v.push_back({"one_query_many_splits", base(1, 1100, 64, 64), {}, {}, 0});
  v.push_back({"odd_dims_59_111", base(3, 333, 59, 111), {}, {}, 0});
  HalfCase c{"causal_softcap_alibi", base(4, 530, 128, 128), {}, {}, 0};
  c.spec.causal = true;
  c.spec.softcap = 6;
  c.spec.alibi = true;
  v.push_back(c);
  c = {"bias_window_dropout", base(2, 300, 64, 32), {}, {}, 0};
  c.spec.has_bias = true;
  c.spec.window_left = 40;
  c.spec.dropout_p = 0.2;
  v.push_back(c);
  c = {"varlen", base(0, 0, 64, 64), {1, 0, 3}, {400, 17, 0}, 0};
  c.spec.layout = Layout::thd;
  v.push_back(c);
  c = {"paged_causal", base(2, 0, 64, 64), {}, {700, 90}, 16};
  c.spec.causal = true;
  v.push_back(c);
  // Row counts and head dims that leave remainders in the kernels' tiles.
  c = {"rows_7_dims_72_40", base(1, 700, 72, 40), {}, {}, 0};
  c.spec.heads_q = 7;
  c.spec.heads_kv = 1;
  v.push_back(c);
  c = {"rows_9_causal_dims_100_24", base(3, 520, 100, 24), {}, {}, 0};
  c.spec.heads_q = 6;
  c.spec.causal = true;
  v.push_back(c);
  return v;
}

class DecodeHalf : public ::testing::TestWithParam<std::tuple<HalfCase, DType>> {};

// The case's problem in dt (a paged case's cache lives in `pages`).
testing::Problem half_problem(const HalfCase& c, DType dt, testing::PagedProblem& pages) {
  if (c.page == 0) return testing::problem_as(testing::make_problem(c.spec, 9, c.lens_q, c.lens_kv), dt);
  pages = testing::make_paged(c.spec, c.page, c.lens_kv, {}, 9);
  return testing::problem_as(testing::paged_as_problem(pages), dt);
}

bool pair_scores(DType dt) { return dt == DType::bf16 && decode_active_isa() == "avx512bf16"; }

TEST_P(DecodeHalf, MatchesReferenceWithinBaseline) {
  const auto& [c, dt] = GetParam();
  testing::PagedProblem pages;
  const testing::Problem half = half_problem(c, dt, pages);
  const auto decode = make_decode_backend();
  ASSERT_TRUE(decode->check(half.spec, Pass::forward).ok()) << decode->check(half.spec, Pass::forward).to_string();
  const testing::PassResults got = testing::run_backend(*decode, half, false);
  const testing::HalfBaseline b = testing::half_baseline(half, testing::problem_as(half, DType::f64), false);
  testing::expect_half_results(got, b, dt, false);
}

TEST_P(DecodeHalf, ConversionPathEqualsF32KernelOnWidenedInputs) {
  const auto& [c, dt] = GetParam();
  if (pair_scores(dt)) GTEST_SKIP() << "bf16 scores on vdpbf16ps";
  testing::PagedProblem pages;
  const testing::Problem half = half_problem(c, dt, pages);
  const auto decode = make_decode_backend();
  const testing::PassResults got = testing::run_backend(*decode, half, false);
  const testing::PassResults f32 = testing::run_backend(*decode, testing::problem_as(half, DType::f32), false);
  EXPECT_TRUE(testing::bitwise_equal(got.out, testing::convert(f32.out, dt)));
  EXPECT_TRUE(testing::bitwise_equal(got.lse, f32.lse));
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeHalf,
                         ::testing::Combine(::testing::ValuesIn(cases()), ::testing::Values(DType::bf16, DType::f16)),
                         [](const auto& param_info) {
                           return std::get<0>(param_info.param).name + "_" + std::string(to_string(std::get<1>(param_info.param)));
                         });

// Kernels read exactly the rows' elements: NaNs right after each q/k/v row
// (where a vector tail or a masked load could reach) change no bit of the
// result, at head dims that leave a partial vector in every path.
TEST(DecodeHalfStrided, ValuesBetweenRowsNeverReachResults) {
  for (DType dt : {DType::bf16, DType::f16}) {
    for (auto [dqk, dv] : {std::pair{59, 111}, std::pair{72, 40}, std::pair{128, 128}}) {
      AttentionSpec s = base(3, 333, dqk, dv);
      s.causal = true;
      const testing::Problem dense = testing::problem_as(testing::make_problem(s, 41), dt);
      testing::Problem strided = dense;
      Tensor sq, sk, sv;
      strided.inputs.q = testing::nan_padded(dense.q, dqk + 37, sq);
      strided.inputs.k = testing::nan_padded(dense.k, dqk + 37, sk);
      strided.inputs.v = testing::nan_padded(dense.v, dv + 21, sv);
      const auto decode = make_decode_backend();
      const testing::PassResults want = testing::run_backend(*decode, dense, false);
      testing::PassResults got;
      got.out = Tensor::zeros_like(want.out);
      got.lse = Tensor::zeros_like(want.lse);
      decode->forward(ForwardArgs{strided.spec, strided.inputs, got.out, got.lse});
      EXPECT_TRUE(testing::bitwise_equal(got.out, want.out)) << to_string(dt) << " " << dqk << "/" << dv;
      EXPECT_TRUE(testing::bitwise_equal(got.lse, want.lse)) << to_string(dt) << " " << dqk << "/" << dv;
    }
  }
}

}  // namespace
}  // namespace attend
