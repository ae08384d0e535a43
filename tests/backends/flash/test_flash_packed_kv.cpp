// The bf16-GEMM forward (avx512bf16, avx512amx, avx512amx-emu) packs K/V once
// per (batch, kv head) for all the pair's tasks, in chunks of pairs within a
// byte budget, or per task where none fits (flash::packed_kv_budget). All
// three must give the same output and LSE bit for bit — blocks start at
// multiples of the block size either way — and within the same-precision rule
// of the f64 reference. Runs once per forced ISA; elsewhere than those
// families the budget changes nothing, which the workspace test states.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "backends/decode/paged_problem.h"
#include "backends/flash/dispatch.h"
#include "support/half_baseline.h"
#include "support/kv8_problem.h"
#include "support/tensors.h"

namespace attend {
namespace {

bool packs_kv() {
  const std::string_view isa = flash_active_isa();
  return isa == "avx512bf16" || isa == "avx512amx" || isa == "avx512amx-emu";
}

// Returns to the environment's budget however a test ends.
struct BudgetGuard {
  ~BudgetGuard() { flash::set_packed_kv_budget(-1); }
};

// Sets an environment variable for a test's scope.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    setenv(name, value, 1);
  }
  ~EnvGuard() {
    if (saved_) {
      setenv(name_, saved_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

AttentionSpec base(std::int64_t sq, std::int64_t sk, std::int64_t hq, std::int64_t hkv, std::int64_t d) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = sq;
  s.seqlen_kv = sk;
  s.heads_q = hq;
  s.heads_kv = hkv;
  s.head_dim_qk = d;
  s.head_dim_v = d;
  s.dtype = DType::bf16;
  return s;
}

struct PackedCase {
  std::string name;
  testing::Problem problem;
  testing::PagedProblem pages{};  // a paged case's pools, which problem's inputs view
  Tensor k_scale{}, v_scale{};    // an 8-bit case's scales, likewise
};

bool all_finite(const Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(testing::element(t, i))) return false;
  }
  return true;
}

std::vector<PackedCase> cases() {
  std::vector<PackedCase> v;
  const auto dense = [&](const std::string& name, const AttentionSpec& s, std::vector<std::int32_t> lq = {},
                         std::vector<std::int32_t> lk = {}) {
    v.push_back({name, testing::problem_as(testing::make_problem(s, 41, lq, lk), DType::bf16)});
  };
  AttentionSpec s = base(300, 520, 6, 2, 64);  // two query blocks, five key blocks, the last partial
  s.causal = true;
  dense("gqa_causal", s);
  // A window whose first visible keys are not at a block boundary: the blocks
  // start before them, at a multiple of the block size, masked.
  s = base(600, 700, 4, 4, 80);
  s.window_left = 150;
  s.window_right = 20;
  dense("window_unaligned", s);
  s = base(280, 333, 3, 1, 59);  // MQA, odd head dims, softcap, ALiBi, sinks
  s.head_dim_v = 111;
  s.softcap = 12;
  s.alibi = true;
  s.softmax_type = SoftmaxType::learnable;
  dense("mqa_odd_dims_softcap_alibi_sinks", s);
  s = base(0, 0, 4, 2, 64);
  s.layout = Layout::thd;
  s.batch = 3;
  s.causal = true;
  dense("varlen_empty", s, {270, 0, 40}, {300, 30, 0});
  s = base(260, 400, 4, 2, 128);
  s.dropout_p = 0.2;
  s.dropout_seed = 9;
  s.layout = Layout::bhsd;
  dense("dropout_bhsd_d128", s);
  // A non-finite value in V that some queries' windows exclude: the block's
  // flag sends it through visible_pv, packed or not.
  s = base(270, 300, 4, 2, 64);
  s.window_left = 40;
  s.window_right = 0;
  PackedCase inf{"inf_in_v_outside_windows", testing::problem_as(testing::make_problem(s, 43), DType::bf16)};
  testing::set_element(inf.problem.v, (0 * 300 + 5) * 2 * 64 + 3, std::numeric_limits<double>::infinity());
  v.push_back(inf);
  // One in the last block past the first query block's last key (causal,
  // Sk - Sq = 100: queries 0-255 see keys up to 355): the block's flag must be
  // the same whichever packed it.
  s = base(300, 400, 4, 2, 64);
  s.causal = true;
  PackedCase tail{"inf_in_v_past_a_tasks_keys", testing::problem_as(testing::make_problem(s, 44), DType::bf16)};
  testing::set_element(tail.problem.v, (0 * 400 + 370) * 2 * 64 + 3, std::numeric_limits<double>::infinity());
  v.push_back(tail);
  // A paged cache with left padding (prefill over it), and an 8-bit one.
  AttentionSpec paged = base(300, 0, 4, 2, 64);
  paged.causal = true;
  paged.dtype = DType::f32;
  PackedCase pc{"paged_leftpad", {}, testing::make_paged(paged, 16, {420, 300}, {7, 0}, 45)};
  pc.problem = testing::problem_as(testing::paged_as_problem(pc.pages), DType::bf16);
  v.push_back(std::move(pc));
  const testing::Problem f32 = testing::make_problem(base(300, 450, 4, 2, 64), 47);
  const auto quantized = [&](const std::string& name, DType kv, KVScale layout) {
    const testing::Kv8Problem q = testing::quantize_problem(f32, DType::bf16, kv, layout, 3);
    v.push_back({name, q.q8, {}, q.k_scale, q.v_scale});
  };
  quantized("i8_per_token", DType::i8, KVScale::per_token);
  quantized("e4m3_per_head", DType::fp8_e4m3, KVScale::per_head);
  return v;
}

TEST(FlashPackedKv, PackedChunkedAndPerTaskAreBitIdentical) {
  const BudgetGuard guard;
  const EnvGuard threads("ATTEND_NUM_THREADS", "2");  // one pair's tasks fill the threads
  const auto flash = make_flash_backend();
  for (const PackedCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const testing::Problem& p = c.problem;
    ASSERT_TRUE(flash->check(p.spec, Pass::forward).ok());
    flash::set_packed_kv_budget(std::int64_t{1} << 40);
    const testing::PassResults all = testing::run_backend(*flash, p, false);
    flash::set_packed_kv_budget(0);
    const std::size_t per_task_bytes = flash->workspace_bytes(p.spec, Pass::forward);
    const testing::PassResults per_task = testing::run_backend(*flash, p, false);
    EXPECT_TRUE(testing::bitwise_equal(all.out, per_task.out));
    EXPECT_TRUE(testing::bitwise_equal(all.lse, per_task.lse));
    // One pair at a time: the budget of one pair's buffer.
    flash::set_packed_kv_budget(std::int64_t{1} << 40);
    const std::size_t pairs = static_cast<std::size_t>(p.spec.batch * p.spec.heads_kv);
    const std::size_t one_pair = (flash->workspace_bytes(p.spec, Pass::forward) - per_task_bytes) / pairs;
    flash::set_packed_kv_budget(static_cast<std::int64_t>(one_pair));
    EXPECT_EQ(flash->workspace_bytes(p.spec, Pass::forward), per_task_bytes + (packs_kv() ? one_pair : 0));
    const testing::PassResults chunked = testing::run_backend(*flash, p, false);
    EXPECT_TRUE(testing::bitwise_equal(all.out, chunked.out));
    EXPECT_TRUE(testing::bitwise_equal(all.lse, chunked.lse));
    if (!p.spec.kv_dtype.has_value() && all_finite(p.v)) {
      const testing::HalfBaseline b = testing::half_baseline(p, testing::problem_as(p, DType::f64), false);
      testing::expect_half_results(all, b, DType::bf16, false);
    }
  }
}

// The packed K/V is the forward's only workspace that grows with the sequence:
// about (head_dim_qk + head_dim_v) x 2 bytes per key and (batch, kv head), in
// the bf16-GEMM families only, and never past the budget.
TEST(FlashPackedKv, WorkspaceGrowsOnlyByThePackedKvWithinTheBudget) {
  const BudgetGuard guard;
  const EnvGuard threads("ATTEND_NUM_THREADS", "2");
  const auto flash = make_flash_backend();
  AttentionSpec s = base(1024, 1024, 8, 2, 128);
  AttentionSpec longer = s;
  longer.seqlen_q = longer.seqlen_kv = 8192;
  flash::set_packed_kv_budget(0);
  const std::size_t flat = flash->workspace_bytes(s, Pass::forward);
  EXPECT_EQ(flash->workspace_bytes(longer, Pass::forward), flat);
  flash::set_packed_kv_budget(std::int64_t{256} << 20);
  const std::size_t packed = flash->workspace_bytes(longer, Pass::forward) - flat;
  if (packs_kv()) {
    const double per_key = static_cast<double>(packed) / (2.0 * 2 * 8192);
    EXPECT_GE(per_key, (128 + 128) * 2.0);
    EXPECT_LE(per_key, (128 + 128) * 2.0 * 1.05);
    flash::set_packed_kv_budget(static_cast<std::int64_t>(packed) - 1);  // 3 of the 4 pairs fit
    EXPECT_EQ(flash->workspace_bytes(longer, Pass::forward) - flat, packed / 4 * 3);
    // Chunks too small to give every thread a task (one pair: 4 heads x 32
    // query blocks) are not worth their pass: each task packs.
    flash::set_packed_kv_budget(static_cast<std::int64_t>(packed / 4));
    EXPECT_EQ(flash->workspace_bytes(longer, Pass::forward) - flat, packed / 4);
    const EnvGuard many("ATTEND_NUM_THREADS", "256");  // 128 tasks a pair
    const std::size_t one_pair_chunks = flash->workspace_bytes(longer, Pass::forward);
    flash::set_packed_kv_budget(0);
    EXPECT_EQ(one_pair_chunks, flash->workspace_bytes(longer, Pass::forward));
  } else {
    EXPECT_EQ(packed, 0u);
  }
  // f32 packs nothing anywhere.
  s.dtype = longer.dtype = DType::f32;
  EXPECT_EQ(flash->workspace_bytes(longer, Pass::forward), flash->workspace_bytes(s, Pass::forward));
}

// ATTEND_FLASH_PACKED_KV_MB sets the budget in MiB; a value that is not one is
// an attend::Error naming the variable and the value wherever it is read.
TEST(FlashPackedKv, BudgetComesFromTheEnvironmentAndBadValuesAreNamed) {
  const BudgetGuard guard;
  flash::set_packed_kv_budget(-1);
  const EnvGuard env("ATTEND_FLASH_PACKED_KV_MB", "3");
  EXPECT_EQ(flash::packed_kv_budget(), std::int64_t{3} << 20);
  const auto flash = make_flash_backend();
  const AttentionSpec s = base(512, 512, 8, 2, 64);
  // Read where a forward would pack: the bf16-GEMM families.
  for (const char* bad : {"-1", "12abc", "99999999999", "x"}) {
    if (!packs_kv()) break;
    const EnvGuard bad_env("ATTEND_FLASH_PACKED_KV_MB", bad);
    try {
      (void)flash->workspace_bytes(s, Pass::forward);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ATTEND_FLASH_PACKED_KV_MB"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace attend
