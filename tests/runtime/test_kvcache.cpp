// attend::KVCache and forward_with_kvcache through the public API: bounds are
// errors (never out-of-bounds writes), appends of different sizes, left padding,
// and attention over the cache against the reference on a gathered dense copy.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"
#include "support/tensors.h"

namespace attend {
namespace {

KVCacheConfig config(std::int64_t batch, std::int64_t page, std::int64_t max_seqlen) {
  KVCacheConfig c;
  c.batch = batch;
  c.heads_kv = 2;
  c.head_dim_qk = 24;
  c.head_dim_v = 40;
  c.page_size = page;
  c.max_seqlen = max_seqlen;
  return c;
}

// N(0,1) values rounded to `dtype`.
Tensor random(std::initializer_list<std::int64_t> shape, std::uint64_t seed, DType dtype = DType::f32) {
  Tensor t = Tensor::zeros(DType::f32, shape);
  testing::fill_normal(t, seed);
  return dtype == DType::f32 ? t : testing::convert(t, dtype);
}

// The cache's contents as plain per-sequence vectors (what a test appended).
struct Shadow {
  std::vector<std::vector<float>> k, v;  // per sequence: tokens x heads_kv x dim
};

void append_all(KVCache& cache, Shadow& sh, std::int64_t s_new, const std::vector<std::int64_t>& counts,
                std::uint64_t seed) {
  const KVCacheConfig& c = cache.config();
  const Tensor k = random({c.batch, s_new, c.heads_kv, c.head_dim_qk}, seed, c.dtype);
  const Tensor v = random({c.batch, s_new, c.heads_kv, c.head_dim_v}, seed + 1, c.dtype);
  cache.append(k, v, counts);
  sh.k.resize(static_cast<std::size_t>(c.batch));
  sh.v.resize(static_cast<std::size_t>(c.batch));
  for (std::int64_t b = 0; b < c.batch; ++b) {
    const std::int64_t n = counts.empty() ? s_new : counts[static_cast<std::size_t>(b)];
    const std::int64_t kr = c.heads_kv * c.head_dim_qk, vr = c.heads_kv * c.head_dim_v;
    for (std::int64_t i = 0; i < n * kr; ++i)
      sh.k[b].push_back(static_cast<float>(testing::element(k, b * s_new * kr + i)));
    for (std::int64_t i = 0; i < n * vr; ++i)
      sh.v[b].push_back(static_cast<float>(testing::element(v, b * s_new * vr + i)));
  }
}

// Reference forward over a gathered dense (varlen thd) copy of the cache's
// keys [leftpad, length) of each sequence, with the same queries.
testing::PassResults gathered_reference(const KVCache& cache, const Shadow& sh, const Tensor& q, AttentionSpec s,
                                        const Tensor& slopes, const Tensor& sinks = {}) {
  const KVCacheConfig& c = cache.config();
  const std::int64_t B = c.batch, sq = q.view().shape[1], H = q.view().shape[2];
  std::vector<std::int32_t> lq(static_cast<std::size_t>(B), static_cast<std::int32_t>(sq)), lk;
  for (std::int64_t b = 0; b < B; ++b) lk.push_back(static_cast<std::int32_t>(cache.length(b) - cache.leftpad(b)));
  s.layout = Layout::thd;
  s.heads_q = H;
  s.heads_kv = c.heads_kv;
  s.head_dim_qk = c.head_dim_qk;
  s.head_dim_v = c.head_dim_v;
  testing::Problem p = testing::make_problem(s, 1, lq, lk);
  for (std::int64_t i = 0; i < q.numel(); ++i)
    p.q.as<float>()[i] = static_cast<float>(testing::element(q, i));  // bshd with equal Sq == thd
  std::int64_t row = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t kr = c.heads_kv * c.head_dim_qk, vr = c.heads_kv * c.head_dim_v, lp = cache.leftpad(b);
    for (std::int64_t t = lp; t < cache.length(b); ++t, ++row) {
      std::copy_n(sh.k[b].data() + t * kr, kr, p.k.as<float>() + row * kr);
      std::copy_n(sh.v[b].data() + t * vr, vr, p.v.as<float>() + row * vr);
    }
  }
  if (s.alibi) {
    p.slopes = slopes;
    p.inputs.alibi_slopes = slopes;
  }
  if (sinks.defined()) {
    p.sinks = sinks;
    p.inputs.sinks = sinks;
  }
  return testing::run_backend(*make_reference_backend(), testing::problem_as_f64(p), false);
}

// out_tol: absolute, for outputs of magnitude <~ 1 (2e-5 suits f32 results).
void expect_close_to_gathered(const ForwardResult& r, const testing::PassResults& ref, std::int64_t B, std::int64_t H,
                              std::int64_t sq, double out_tol = 2e-5) {
  // out: bshd (B,Sq,H,Dv) and thd (B*Sq,H,Dv) share one element order.
  double err = 0;
  for (std::int64_t i = 0; i < r.out.numel(); ++i) {
    err = std::max(err, std::abs(testing::element(r.out, i) - ref.out.as<double>()[i]));
  }
  EXPECT_LT(err, out_tol);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t i = 0; i < sq; ++i) {
        const double got = r.lse.as<float>()[(b * H + h) * sq + i];
        const double want = ref.lse.as<double>()[h * B * sq + b * sq + i];
        if (std::isinf(want)) {
          EXPECT_EQ(got, want);
        } else {
          EXPECT_NEAR(got, want, 2e-5 * std::max(1.0, std::abs(want)));
        }
      }
    }
  }
}

class KVCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Registry::global().reset_to_builtins();
    set_policy(Policy{});
  }
};

TEST_F(KVCacheTest, ConfigErrorsNameTheField) {
  EXPECT_THROW(KVCache(config(2, 3, 10)), Error);  // not a power of two
  EXPECT_THROW(KVCache(config(0, 4, 10)), Error);
  EXPECT_THROW(KVCache(config(2, 4, 0)), Error);
  try {
    KVCache bad(config(2, 48, 10));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "KVCacheConfig.page_size");
  }
  const KVCache ok(config(3, 1, 5));  // page size 1 is a power of two
  EXPECT_EQ(ok.capacity(), 5);
  EXPECT_EQ(ok.free_pages(), 15);
}

TEST_F(KVCacheTest, AppendsOfDifferentSizesFillPagesInTokenOrder) {
  KVCache cache(config(3, 4, 20));
  Shadow sh;
  append_all(cache, sh, 5, {5, 1, 0}, 10);
  append_all(cache, sh, 3, {}, 11);
  append_all(cache, sh, 7, {0, 7, 2}, 12);
  EXPECT_EQ(cache.length(0), 8);
  EXPECT_EQ(cache.length(1), 11);
  EXPECT_EQ(cache.length(2), 5);
  // Every stored token reads back through the block table.
  const KVCacheConfig& c = cache.config();
  const auto* table = cache.block_table().as<const std::int32_t>();
  for (std::int64_t b = 0; b < 3; ++b) {
    for (std::int64_t t = 0; t < cache.length(b); ++t) {
      const std::int64_t page = table[b * cache.pages_per_sequence() + t / 4];
      ASSERT_GE(page, 0);
      const float* k = cache.k_pages().as<float>() + (page * 4 + t % 4) * c.heads_kv * c.head_dim_qk;
      const float* v = cache.v_pages().as<float>() + (page * 4 + t % 4) * c.heads_kv * c.head_dim_v;
      EXPECT_TRUE(std::equal(k, k + c.heads_kv * c.head_dim_qk, sh.k[b].data() + t * c.heads_kv * c.head_dim_qk));
      EXPECT_TRUE(std::equal(v, v + c.heads_kv * c.head_dim_v, sh.v[b].data() + t * c.heads_kv * c.head_dim_v));
    }
  }
  // reset returns the pages; the sequence starts over.
  const std::int64_t free_before = cache.free_pages();
  cache.reset(1);
  EXPECT_EQ(cache.length(1), 0);
  EXPECT_EQ(cache.free_pages(), free_before + 3);
}

TEST_F(KVCacheTest, OutOfRangeRequestsAreErrorsAndChangeNothing) {
  KVCache cache(config(2, 4, 8));
  Shadow sh;
  append_all(cache, sh, 6, {}, 1);
  const Tensor k1 = random({3, 2, 24}, 2), v1 = random({3, 2, 40}, 3);
  EXPECT_THROW(cache.append(2, k1, v1), Error);  // sequence id out of range
  EXPECT_THROW(cache.append(-1, k1, v1), Error);
  EXPECT_THROW(cache.append(0, k1, v1), Error);  // 6 + 3 > capacity 8
  EXPECT_EQ(cache.length(0), 6);
  const Tensor k2 = random({2, 3, 2, 24}, 4), v2 = random({2, 3, 2, 40}, 5);
  const std::vector<std::int64_t> counts{1, 3};
  EXPECT_THROW(cache.append(k2, v2, counts), Error);  // sequence 1 overflows: all or nothing
  EXPECT_EQ(cache.length(0), 6);
  EXPECT_EQ(cache.length(1), 6);
  const Tensor wrong = random({3, 2, 25}, 6);
  EXPECT_THROW(cache.append(0, wrong, v1), Error);  // head_dim mismatch
  EXPECT_THROW((void)cache.length(5), Error);
  EXPECT_THROW(cache.set_leftpad(0, 9), Error);
  // A pool smaller than the sequences' capacity runs out of pages: an error too.
  KVCacheConfig small = config(2, 4, 8);
  small.num_pages = 3;
  KVCache tight(small);
  const Tensor k8 = random({2, 8, 2, 24}, 7), v8 = random({2, 8, 2, 40}, 8);
  EXPECT_THROW(tight.append(k8, v8), Error);
  EXPECT_EQ(tight.free_pages(), 3);
}

TEST_F(KVCacheTest, BlockTableEntryOutOfRangeIsAnErrorBeforeAnyRead) {
  KVCache cache(config(2, 4, 16));
  Shadow sh;
  append_all(cache, sh, 9, {}, 1);
  const Tensor q = random({2, 1, 4, 24}, 2);
  AttentionSpec s;
  (void)forward_with_kvcache(q, cache, s);  // fine as built
  std::int32_t& entry = cache.block_table().as<std::int32_t>()[1 * cache.pages_per_sequence() + 2];
  const std::int32_t saved = entry;
  for (const std::int32_t bad : {-1, 1000}) {
    entry = bad;
    try {
      (void)forward_with_kvcache(q, cache, s);
      FAIL() << "accepted block table entry " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_EQ(e.field(), "block_table[1][2]");
    }
  }
  entry = saved;
  // Appends never write through the user-visible table: still correct afterwards.
  (void)forward_with_kvcache(q, cache, s);
}

TEST_F(KVCacheTest, TrainingModeIsAClearError) {
  KVCache cache(config(1, 4, 8));
  Shadow sh;
  append_all(cache, sh, 3, {}, 1);
  const Tensor q = random({1, 1, 2, 24}, 2);
  try {
    (void)forward_with_kvcache(q, cache, AttentionSpec{}, Mode::training);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "mode");
    EXPECT_NE(std::string(e.what()).find("inference-only"), std::string::npos);
  }
}

struct CacheCase {
  std::int64_t page, sq, heads_q;
  bool causal, alibi;
  std::int64_t window_left;
  double softcap;
  const char* backend;  // expected selection
  SoftmaxType softmax = SoftmaxType::vanilla;
};

class KVCacheAttention : public KVCacheTest, public ::testing::WithParamInterface<CacheCase> {};

TEST_P(KVCacheAttention, MatchesReferenceOnAGatheredDenseCopy) {
  const CacheCase& cc = GetParam();
  KVCache cache(config(3, cc.page, 700));
  Shadow sh;
  // Interleaved appends of different sizes scatter each sequence over the pool.
  append_all(cache, sh, 200, {200, 37, 150}, 1);
  append_all(cache, sh, 1, {}, 2);
  append_all(cache, sh, 300, {120, 0, 300}, 3);
  append_all(cache, sh, cc.sq, {}, 4);  // the new tokens whose queries attend
  cache.set_leftpad(1, 5);              // sequence 1 was left-padded by 5 tokens
  AttentionSpec s;
  s.causal = cc.causal;
  s.window_left = cc.window_left;
  s.softcap = cc.softcap;
  s.alibi = cc.alibi;
  Tensor slopes;
  if (cc.alibi) {
    slopes = Tensor::zeros(DType::f32, {cc.heads_q});
    for (std::int64_t h = 0; h < cc.heads_q; ++h) slopes.as<float>()[h] = 0.05f * static_cast<float>(h + 1);
  }
  s.softmax_type = cc.softmax;
  Tensor sinks;
  if (cc.softmax == SoftmaxType::learnable) {
    sinks = Tensor::zeros(DType::f32, {cc.heads_q});
    for (std::int64_t h = 0; h < cc.heads_q; ++h) sinks.as<float>()[h] = 0.7f * static_cast<float>(h) - 1.0f;
  }
  const Tensor q = random({3, cc.sq, cc.heads_q, 24}, 5);
  const ForwardResult r = forward_with_kvcache(q, cache, s, Mode::inference, slopes, nullptr, sinks);
  EXPECT_EQ(r.ctx.backend().name(), cc.backend);
  EXPECT_EQ(r.ctx.spec().kv_page_size, cc.page);
  EXPECT_TRUE(r.ctx.spec().kv_leftpad);
  expect_close_to_gathered(r, gathered_reference(cache, sh, q, s, slopes, sinks), 3, cc.heads_q, cc.sq);
  EXPECT_THROW((void)backward(r.ctx, r.out), Error);  // an inference context
}

INSTANTIATE_TEST_SUITE_P(
    Cases, KVCacheAttention,
    ::testing::Values(
        CacheCase{64, 1, 4, true, false, -1, 0, "decode"}, CacheCase{1, 1, 2, false, false, -1, 0, "decode"},
        CacheCase{16, 3, 8, true, true, 100, 0, "decode"}, CacheCase{4, 2, 4, true, false, -1, 8.0, "decode"},
        // prefill: a query block too long for decode runs on flash, from the same pages
        CacheCase{64, 40, 4, true, false, -1, 0, "flash"}, CacheCase{8, 33, 2, true, true, 64, 0, "flash"},
        // attention sinks on both paths
        CacheCase{16, 1, 4, true, false, -1, 0, "decode", SoftmaxType::learnable},
        CacheCase{4, 2, 8, true, false, -1, 0, "decode", SoftmaxType::off_by_one},
        CacheCase{64, 40, 4, true, false, -1, 0, "flash", SoftmaxType::learnable}),
    [](const ::testing::TestParamInfo<CacheCase>& param_info) {
      const CacheCase& c = param_info.param;
      return std::string(c.backend) + "_page" + std::to_string(c.page) + "_sq" + std::to_string(c.sq) + "_h" +
             std::to_string(c.heads_q) + (c.causal ? "_causal" : "") + (c.alibi ? "_alibi" : "") +
             (c.window_left >= 0 ? "_window" + std::to_string(c.window_left) : "") + (c.softcap > 0 ? "_softcap" : "") +
             (c.softmax != SoftmaxType::vanilla ? "_" + std::string(to_string(c.softmax)) : "");
    });

// bf16/f16 caches: pages in the cache's dtype, read by decode (single queries)
// and by flash (prefill) against the f64 reference on the same rounded values.
struct HalfCacheCase {
  DType dtype;
  std::int64_t page, sq;
  const char* backend;
};

class KVCacheHalf : public KVCacheTest, public ::testing::WithParamInterface<HalfCacheCase> {};

TEST_P(KVCacheHalf, MatchesReferenceOnTheSameRoundedValues) {
  const HalfCacheCase& hc = GetParam();
  KVCacheConfig c = config(2, hc.page, 400);
  c.dtype = hc.dtype;
  KVCache cache(c);
  EXPECT_EQ(cache.k_pages().view().dtype, hc.dtype);
  Shadow sh;
  append_all(cache, sh, 150, {150, 61}, 11);
  append_all(cache, sh, 200, {3, 200}, 12);
  append_all(cache, sh, hc.sq, {}, 13);
  cache.set_leftpad(0, 7);
  AttentionSpec s;
  s.causal = true;
  const Tensor q = random({2, hc.sq, 4, 24}, 14, hc.dtype);
  const ForwardResult r = forward_with_kvcache(q, cache, s);
  EXPECT_EQ(r.ctx.backend().name(), hc.backend);
  EXPECT_EQ(r.out.view().dtype, hc.dtype);
  // Rounding the output to the dtype (and, for flash's bf16 AMX GEMMs, P to bf16).
  const double tol = hc.dtype == DType::bf16 ? 1.5e-2 : 4e-3;
  expect_close_to_gathered(r, gathered_reference(cache, sh, q, s, Tensor{}), 2, 4, hc.sq, tol);
}

INSTANTIATE_TEST_SUITE_P(Cases, KVCacheHalf,
                         ::testing::Values(HalfCacheCase{DType::bf16, 16, 1, "decode"},
                                           HalfCacheCase{DType::f16, 64, 4, "decode"},
                                           HalfCacheCase{DType::bf16, 8, 40, "flash"},
                                           HalfCacheCase{DType::f16, 32, 33, "flash"}),
                         [](const ::testing::TestParamInfo<HalfCacheCase>& param_info) {
                           const HalfCacheCase& c = param_info.param;
                           return std::string(c.backend) + "_" + std::string(to_string(c.dtype)) + "_page" +
                                  std::to_string(c.page) + "_sq" + std::to_string(c.sq);
                         });

TEST_F(KVCacheTest, HalfCacheTakesOnlyItsOwnDtype) {
  KVCacheConfig c = config(2, 16, 64);
  c.dtype = DType::bf16;
  KVCache cache(c);
  const Tensor k32 = random({2, 3, 2, 24}, 1), v32 = random({2, 3, 2, 40}, 2);
  try {
    cache.append(k32, v32);
    FAIL() << "an f32 append into a bf16 cache must be an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "k.dtype");
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.length(0), 0);
  cache.append(testing::convert(k32, DType::bf16), testing::convert(v32, DType::bf16));
  EXPECT_EQ(cache.length(1), 3);
  try {
    (void)forward_with_kvcache(random({2, 1, 4, 24}, 3), cache, AttentionSpec{});
    FAIL() << "f32 queries over a bf16 cache must be an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "q.dtype");
  }
  c.dtype = DType::i32;
  EXPECT_THROW(KVCache{c}, Error);
}

}  // namespace
}  // namespace attend
