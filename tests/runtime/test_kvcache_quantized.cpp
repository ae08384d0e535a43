// The 8-bit KV cache: appends quantize by the documented rule (checked against
// kv8_code on the test's own scales), forward over the cache matches the f64
// reference on its dequantized pages, a refused append changes nothing, and
// the quantization error against the unquantized K/V stays small.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "support/kv8_problem.h"

namespace attend {
namespace {

KVCacheConfig config(DType kv, std::optional<KVScale> layout = {}) {
  KVCacheConfig c;
  c.batch = 2;
  c.heads_kv = 2;
  c.head_dim_qk = 32;
  c.head_dim_v = 24;
  c.max_seqlen = 100;
  c.page_size = 16;
  c.dtype = DType::bf16;
  c.kv_dtype = kv;
  c.kv_scale = layout;
  return c;
}

Tensor random_bf16(std::initializer_list<std::int64_t> shape, std::uint64_t seed, double stddev = 1.0) {
  Tensor t = Tensor::zeros(DType::bf16, shape);
  testing::fill_normal(t, seed, stddev);
  return t;
}

// The bytes of every tensor the cache owns.
std::vector<std::byte> snapshot(const KVCache& c) {
  std::vector<std::byte> out;
  for (const Tensor* t : {&c.k_pages(), &c.v_pages(), &c.block_table(), &c.seqlens(), &c.k_scales(), &c.v_scales()}) {
    if (!t->defined()) continue;
    const auto* p = static_cast<const std::byte*>(t->data());
    out.insert(out.end(), p, p + t->numel() * static_cast<std::int64_t>(size_of(t->view().dtype)));
  }
  return out;
}

TEST(Kv8Cache, PerTokenAppendFollowsTheRule) {
  for (DType kv : {DType::i8, DType::fp8_e4m3, DType::fp8_e5m2}) {
    KVCache cache(config(kv, KVScale::per_token));
    const Tensor k = random_bf16({5, 2, 32}, 1), v = random_bf16({5, 2, 24}, 2);
    cache.append(1, k, v);
    const float cmax = testing::kv_code_max(kv);
    const std::int32_t page = cache.block_table().as<std::int32_t>()[1 * cache.pages_per_sequence()];
    for (std::int64_t t = 0; t < 5; ++t) {
      for (std::int64_t h = 0; h < 2; ++h) {
        float amax = 0;
        for (std::int64_t d = 0; d < 32; ++d)
          amax = std::max(amax, std::fabs(float(testing::element(k, (t * 2 + h) * 32 + d))));
        const std::int64_t row = page * 16 + t;
        const float scale = cache.k_scales().as<float>()[row * 2 + h];
        EXPECT_EQ(scale, amax / cmax) << to_string(kv);
        for (std::int64_t d = 0; d < 32; ++d) {
          const auto x = static_cast<float>(testing::element(k, (t * 2 + h) * 32 + d));
          EXPECT_EQ(cache.k_pages().as<std::uint8_t>()[(row * 2 + h) * 32 + d], kv8_code(kv, x / scale))
              << to_string(kv) << " t" << t << " h" << h << " d" << d;
        }
      }
    }
  }
}

TEST(Kv8Cache, PerHeadScalesAreFixedByTheFirstAppendAndLaterValuesSaturate) {
  KVCache cache(config(DType::fp8_e4m3));
  ASSERT_EQ(cache.scale_layout(), KVScale::per_head);
  Tensor k = random_bf16({4, 2, 32}, 3), v = random_bf16({4, 2, 24}, 4);
  cache.append(0, k, v);
  float amax = 0;
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t d = 0; d < 32; ++d)
      amax = std::max(amax, std::fabs(float(testing::element(k, (i * 2 + 1) * 32 + d))));
  const float s = cache.k_scales().as<float>()[0 * 2 + 1];
  EXPECT_EQ(s, 2.0f * amax / 448.0f);
  // A later token 10x larger saturates at the largest code, with its sign.
  Tensor big = random_bf16({1, 2, 32}, 5);
  testing::set_element(big, 32 + 3, -10.0 * amax);
  cache.append(0, big, random_bf16({1, 2, 24}, 6));
  const std::int32_t page = cache.block_table().as<std::int32_t>()[0];
  EXPECT_EQ(cache.k_pages().as<std::uint8_t>()[((page * 16 + 4) * 2 + 1) * 32 + 3], 0xfe);  // -448
  EXPECT_EQ(cache.k_scales().as<float>()[1], s);                                            // unchanged
  // set_scales on a non-empty sequence is refused; after reset it applies.
  const std::vector<float> mine = {0.5f, 0.25f};
  EXPECT_THROW(cache.set_scales(0, mine, mine), Error);
  cache.reset(0);
  cache.set_scales(0, mine, mine);
  cache.append(0, k, v);
  EXPECT_EQ(cache.k_scales().as<float>()[1], 0.25f);
  const std::vector<float> bad = {0.5f, 0.0f};
  cache.reset(1);
  EXPECT_THROW(cache.set_scales(1, bad, mine), Error);
}

TEST(Kv8Cache, NonFiniteAppendIsRefusedByNameAndChangesNothing) {
  for (DType kv : {DType::i8, DType::fp8_e4m3, DType::fp8_e5m2}) {
    KVCache cache(config(kv));
    cache.append(0, random_bf16({3, 2, 32}, 7), random_bf16({3, 2, 24}, 8));
    const std::vector<std::byte> before = snapshot(cache);
    Tensor k = random_bf16({2, 4, 2, 32}, 9), v = random_bf16({2, 4, 2, 24}, 10);
    testing::set_element(v, ((1 * 4 + 2) * 2 + 1) * 24 + 5, std::numeric_limits<double>::infinity());
    try {
      cache.append(k, v);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "v[1][2][1][5]") << e.what();
    }
    EXPECT_EQ(snapshot(cache), before) << to_string(kv);
  }
}

// forward_with_kvcache on the quantized cache: the kernel against the f64
// reference on the cache's own dequantized pages (the rule), and the whole
// (quantization included) against f64 on the unquantized K/V: a measured bound.
TEST(Kv8Cache, ForwardMatchesDequantizedReferenceAndStaysCloseToUnquantized) {
  struct Bound {
    DType kv;
    double max_rel;
  };
  // Measured on this problem (max |err| / max |out|): i8 (per token) 0.014,
  // e4m3 (per head) 0.039, e5m2 (per head) 0.12; the bounds leave 2x room.
  for (const Bound& bnd : {Bound{DType::i8, 0.03}, Bound{DType::fp8_e4m3, 0.08}, Bound{DType::fp8_e5m2, 0.25}}) {
    KVCacheConfig c = config(bnd.kv);
    c.dtype = DType::f32;
    KVCache cache(c);
    KVCacheConfig plain_c = c;
    plain_c.kv_dtype.reset();
    KVCache plain(plain_c);
    Tensor k = Tensor::zeros(DType::f32, {2, 90, 2, 32}), v = Tensor::zeros(DType::f32, {2, 90, 2, 24});
    testing::fill_normal(k, 11);
    testing::fill_normal(v, 12);
    const std::vector<std::int64_t> counts = {90, 61};
    cache.append(k, v, counts);
    plain.append(k, v, counts);
    Tensor q = Tensor::zeros(DType::f32, {2, 3, 4, 32});
    testing::fill_normal(q, 13);
    AttentionSpec spec;
    spec.causal = true;
    const ForwardResult got = forward_with_kvcache(q, cache, spec);
    const ForwardResult exact = forward_with_kvcache(q, plain, spec);
    // The kernel: the reference on the dequantized pages.
    const KVCacheProblem prob = kvcache_problem(q, cache, spec);
    testing::Problem p;
    p.spec = prob.spec;
    p.inputs = prob.inputs;
    p.q = Tensor::zeros_like(q.view());
    std::memcpy(p.q.data(), q.data(), static_cast<std::size_t>(q.numel()) * 4);
    p.inputs.q = p.q;
    testing::Kv8Problem deq;
    deq.q8 = p;
    // Dequantize the pools in f64 by hand (i8: per_token scales, fp8: per_head).
    const auto dequant = [&](const Tensor& codes, const Tensor& scales) {
      TensorView dv = codes.view();
      dv.dtype = DType::f64;
      Tensor out = Tensor::zeros_like(dv);
      const std::int64_t d = dv.shape[3], pages = dv.shape[0], ps = dv.shape[1];
      for (std::int64_t pg = 0; pg < pages; ++pg) {
        // The sequence owning the page (per_head scales); unowned pages are never read.
        std::int64_t owner = 0;
        for (std::int64_t b = 0; b < 2; ++b)
          for (std::int64_t w = 0; w < cache.pages_per_sequence(); ++w)
            if (cache.block_table().as<std::int32_t>()[b * cache.pages_per_sequence() + w] == pg) owner = b;
        for (std::int64_t i = 0; i < ps * 2 * d; ++i) {
          const std::int64_t h = (i / d) % 2, idx = pg * ps * 2 * d + i, token = pg * ps + i / (2 * d);
          const float scale = cache.scale_layout() == KVScale::per_token ? scales.as<float>()[token * 2 + h]
                                                                         : scales.as<float>()[owner * 2 + h];
          out.as<double>()[idx] = testing::code_value(codes.view(), idx) * scale;
        }
      }
      return out;
    };
    testing::Problem f64 = p;
    f64.spec.dtype = DType::f64;
    f64.spec.kv_dtype.reset();
    f64.spec.kv_scale = KVScale::none;
    f64.q = testing::to_f64(p.q);
    f64.k = dequant(cache.k_pages(), cache.k_scales());
    f64.v = dequant(cache.v_pages(), cache.v_scales());
    f64.inputs.q = f64.q;
    f64.inputs.k = f64.k;
    f64.inputs.v = f64.v;
    f64.inputs.k_scale = {};
    f64.inputs.v_scale = {};
    const testing::PassResults ref = testing::run_backend(*make_reference_backend(), f64, false);
    const double kernel_err = testing::max_abs_diff(got.out, ref.out);
    EXPECT_LE(kernel_err, 2e-5) << to_string(bnd.kv);
    const double quant_err = testing::max_abs_diff(got.out, exact.out) / testing::max_abs(exact.out);
    EXPECT_LE(quant_err, bnd.max_rel) << to_string(bnd.kv);
    EXPECT_GT(quant_err, 0.0) << to_string(bnd.kv);  // the cache really is quantized
  }
}

}  // namespace
}  // namespace attend
