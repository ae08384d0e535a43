// kv8_error: what an 8-bit KV cache costs in accuracy. Attention over fp8
// (e4m3, e5m2) and int8 caches, each scale layout the cache offers, against
// float64 attention on the ORIGINAL unquantized K/V, on random normal K/V and
// on K/V whose keys have a few outlier channels (real models' keys carry a
// handful of head-dim channels far larger than the rest, which a per-head or
// per-token scale must cover). Prints a markdown table.
//
//   kv8_error [--seqlen-kv N] [--seed S] [--help]
//
// The cache is filled as a server fills it: the prompt in one append (which
// fixes fp8's per_head scales, with KVCache's 2x headroom), then 256 decode
// tokens one at a time. Queries are f32 and the cache's wide dtype is f32, so
// the kernels' own rounding (the "f32 (no quantization)" row) is far below the
// quantization error; the "bf16" row stores K/V rounded to bf16 in the same
// f32 cache: the error of a bf16 cache's storage, the baseline an 8-bit cache
// is weighed against. Error of one output row (b, query, head):
// ||out - ref||_2 / ||ref||_2 over its head_dim_v; max and mean over rows.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attend/attend.h"

namespace {

using attend::DType;
using attend::KVScale;

constexpr std::int64_t kBatch = 2, kHq = 8, kHkv = 2, kD = 128, kDecodeTokens = 256;
constexpr std::int64_t kPrefillQ = 64;  // a causal query chunk (flash); decode is one query (decode)
// Outlier key channels: 4 of 128, 20x the others, the same in every token and
// head (as the few large channels of LLaMA-family keys).
constexpr std::int64_t kOutlierChannels[] = {7, 33, 70, 101};
constexpr float kOutlierGain = 20.0f;

struct Data {
  std::vector<float> k, v;  // (B, S, Hkv, D), the values appended (f32, exact)
};

Data make_data(std::int64_t sk, bool outliers, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Data d;
  const auto count = static_cast<std::size_t>(kBatch * sk * kHkv * kD);
  d.k.resize(count);
  d.v.resize(count);
  for (float& x : d.k) x = n(rng);
  for (float& x : d.v) x = n(rng);
  if (outliers) {
    for (std::size_t row = 0; row < count / kD; ++row) {
      for (const std::int64_t c : kOutlierChannels) d.k[row * kD + static_cast<std::size_t>(c)] *= kOutlierGain;
    }
  }
  return d;
}

float round_bf16(float x) {
  const auto u = std::bit_cast<std::uint32_t>(x);
  return std::bit_cast<float>((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

struct CacheKind {
  std::string name;
  std::optional<DType> kv_dtype;  // none: f32 pages
  std::optional<KVScale> scale;   // none: the cache's default
  bool bf16_values = false;       // K/V rounded to bf16 before the append
};

// float64 attention on the original K/V: out (B, sq, Hq, D), queries bottom-right causal.
std::vector<double> reference(const Data& d, const std::vector<float>& q, std::int64_t sk, std::int64_t sq,
                              double scale) {
  std::vector<double> out(static_cast<std::size_t>(kBatch * sq * kHq * kD));
  std::vector<double> p(static_cast<std::size_t>(sk));
  for (std::int64_t b = 0; b < kBatch; ++b) {
    for (std::int64_t i = 0; i < sq; ++i) {
      for (std::int64_t h = 0; h < kHq; ++h) {
        const std::int64_t hk = h / (kHq / kHkv), last = sk - sq + i;  // keys [0, last]
        const float* qr = &q[static_cast<std::size_t>(((b * sq + i) * kHq + h) * kD)];
        double m = -INFINITY;
        for (std::int64_t j = 0; j <= last; ++j) {
          const float* kr = &d.k[static_cast<std::size_t>(((b * sk + j) * kHkv + hk) * kD)];
          double s = 0;
          for (std::int64_t c = 0; c < kD; ++c) s += static_cast<double>(qr[c]) * kr[c];
          p[static_cast<std::size_t>(j)] = s * scale;
          m = std::max(m, s * scale);
        }
        double sum = 0;
        for (std::int64_t j = 0; j <= last; ++j) {
          double& x = p[static_cast<std::size_t>(j)];
          x = std::exp(x - m);
          sum += x;
        }
        double* o = &out[static_cast<std::size_t>(((b * sq + i) * kHq + h) * kD)];
        for (std::int64_t j = 0; j <= last; ++j) {
          const float* vr = &d.v[static_cast<std::size_t>(((b * sk + j) * kHkv + hk) * kD)];
          const double w = p[static_cast<std::size_t>(j)] / sum;
          for (std::int64_t c = 0; c < kD; ++c) o[c] += w * vr[c];
        }
      }
    }
  }
  return out;
}

attend::KVCache fill(const CacheKind& kind, const Data& d, std::int64_t sk) {
  attend::KVCacheConfig c;
  c.batch = kBatch;
  c.heads_kv = kHkv;
  c.head_dim_qk = c.head_dim_v = kD;
  c.max_seqlen = sk;
  c.dtype = DType::f32;
  c.kv_dtype = kind.kv_dtype;
  c.kv_scale = kind.scale;
  attend::KVCache cache(c);
  const auto append = [&](std::int64_t t0, std::int64_t n) {
    attend::Tensor k = attend::Tensor::zeros(DType::f32, {kBatch, n, kHkv, kD});
    attend::Tensor v = attend::Tensor::zeros(DType::f32, {kBatch, n, kHkv, kD});
    const std::int64_t row = kHkv * kD;
    for (std::int64_t b = 0; b < kBatch; ++b) {
      for (std::int64_t i = 0; i < n * row; ++i) {
        const auto src = static_cast<std::size_t>((b * sk + t0) * row + i);
        k.as<float>()[b * n * row + i] = kind.bf16_values ? round_bf16(d.k[src]) : d.k[src];
        v.as<float>()[b * n * row + i] = kind.bf16_values ? round_bf16(d.v[src]) : d.v[src];
      }
    }
    cache.append(k, v);
  };
  const std::int64_t prompt = sk - kDecodeTokens;
  append(0, prompt);
  for (std::int64_t t = prompt; t < sk; ++t) append(t, 1);
  return cache;
}

struct Errors {
  double max = 0, mean = 0;
};

Errors attention_error(const attend::KVCache& cache, const std::vector<float>& q, const std::vector<double>& ref,
                       std::int64_t sq) {
  attend::Tensor qt = attend::Tensor::zeros(DType::f32, {kBatch, sq, kHq, kD});
  std::copy(q.begin(), q.end(), qt.as<float>());
  attend::AttentionSpec opts;
  opts.causal = true;
  const attend::ForwardResult r = attend::forward_with_kvcache(qt, cache, opts);
  const float* out = static_cast<const float*>(r.out.view().data);
  Errors e;
  const std::int64_t rows = kBatch * sq * kHq;
  for (std::int64_t row = 0; row < rows; ++row) {
    double num = 0, den = 0;
    for (std::int64_t c = 0; c < kD; ++c) {
      const double x = ref[static_cast<std::size_t>(row * kD + c)];
      num += (out[row * kD + c] - x) * (out[row * kD + c] - x);
      den += x * x;
    }
    const double rel = std::sqrt(num / den);
    e.max = std::max(e.max, rel);
    e.mean += rel / static_cast<double>(rows);
  }
  return e;
}

constexpr const char* kUsage =
    "usage: kv8_error [--seqlen-kv N] [--seed S]\n"
    "  relative error of attention over 8-bit KV caches (fp8_e4m3, fp8_e5m2, i8; each scale layout) against\n"
    "  float64 attention on the unquantized K/V, on normal K/V and on keys with outlier channels (markdown).\n"
    "  --seqlen-kv N  cached tokens per sequence (default 4096, at least 512)\n"
    "  --seed S       seed of the random K/V and queries (default 1)\n"
    "Exit codes: 0 success, 1 usage error, 2 attend error.\n";

}  // namespace

int main(int argc, char** argv) try {
  std::int64_t sk = 4096;
  std::uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a != "--seqlen-kv" && a != "--seed") {
      std::fprintf(stderr, "kv8_error: unknown flag '%s' (see --help)\n", a.c_str());
      return 1;
    }
    char* end = nullptr;
    const long long v = i + 1 < argc ? std::strtoll(argv[i + 1], &end, 10) : -1;
    if (i + 1 >= argc || *end != '\0' || v < (a == "--seed" ? 0 : 512)) {
      std::fprintf(stderr, "kv8_error: %s needs %s (see --help)\n", a.c_str(),
                   a == "--seed" ? "a non-negative integer" : "an integer >= 512");
      return 1;
    }
    ++i;
    if (a == "--seed") {
      seed = static_cast<std::uint64_t>(v);
    } else {
      sk = v;
    }
  }

  const std::vector<CacheKind> kinds = {
      {"f32 (no quantization)", std::nullopt, std::nullopt, false},
      {"bf16 values", std::nullopt, std::nullopt, true},
      {"fp8_e4m3", DType::fp8_e4m3, std::nullopt, false},
      {"fp8_e4m3", DType::fp8_e4m3, KVScale::per_token, false},
      {"fp8_e5m2", DType::fp8_e5m2, std::nullopt, false},
      {"fp8_e5m2", DType::fp8_e5m2, KVScale::per_token, false},
      {"i8", DType::i8, std::nullopt, false},
      {"i8", DType::i8, KVScale::per_head, false},
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  std::printf(
      "kv8_error: B=%lld H=%lld/%lld D=%lld, %lld cached tokens (a prompt appended at once, then %lld "
      "one at a time), f32 queries N(0,1), causal; decode: 1 query (decode backend), prefill: a %lld-query "
      "chunk (flash); error of a row = ||out - ref||2 / ||ref||2 against float64 attention on the "
      "unquantized K/V; outliers: key channels {7,33,70,101} x%.0f\n\n",
      static_cast<long long>(kBatch), static_cast<long long>(kHq), static_cast<long long>(kHkv),
      static_cast<long long>(kD), static_cast<long long>(sk), static_cast<long long>(kDecodeTokens),
      static_cast<long long>(kPrefillQ), static_cast<double>(kOutlierGain));
  std::printf("| K/V | cache | scales | decode max | decode mean | prefill max | prefill mean |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const bool outliers : {false, true}) {
    const Data d = make_data(sk, outliers, seed);
    std::mt19937_64 rng(seed + 100);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> q_dec(static_cast<std::size_t>(kBatch * kHq * kD));
    std::vector<float> q_pre(static_cast<std::size_t>(kBatch * kPrefillQ * kHq * kD));
    for (float& x : q_dec) x = n(rng);
    for (float& x : q_pre) x = n(rng);
    const std::vector<double> ref_dec = reference(d, q_dec, sk, 1, scale);
    const std::vector<double> ref_pre = reference(d, q_pre, sk, kPrefillQ, scale);
    for (const CacheKind& kind : kinds) {
      const attend::KVCache cache = fill(kind, d, sk);
      const Errors dec = attention_error(cache, q_dec, ref_dec, 1);
      const Errors pre = attention_error(cache, q_pre, ref_pre, kPrefillQ);
      const std::string scales =
          cache.quantized() ? std::string(attend::to_string(cache.scale_layout())) + (kind.scale ? "" : " (default)")
                            : "-";
      std::printf("| %s | %s | %s | %.2e | %.2e | %.2e | %.2e |\n", outliers ? "outlier K channels" : "normal",
                  kind.name.c_str(), scales.c_str(), dec.max, dec.mean, pre.max, pre.mean);
      std::fflush(stdout);
    }
  }
  return 0;
} catch (const attend::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 2;
}
