#include "decode_kv8.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/decode.h"
#include "attend/backends/flash.h"

namespace decode_bench {

namespace {

using attend::DType;
using Clock = std::chrono::steady_clock;

struct Shape {
  std::int64_t hq, hkv, d;
};
// GQA 14/2 is Qwen2-0.5B's and 32/8 Llama-3-8B's; each at both head dims.
constexpr Shape kShapes[] = {{14, 2, 64}, {14, 2, 128}, {32, 8, 64}, {32, 8, 128}};
constexpr Shape kSweepShape{32, 8, 128};
constexpr std::int64_t kPageSize = 64;

std::string name_of(DType kv, attend::KVScale scale) {
  std::string s(attend::to_string(kv));
  if (scale != attend::KVScale::none) s += "/" + std::string(attend::to_string(scale));
  return s;
}

// x in [-0.5, 0.5) as element i of a wide tensor (bf16 truncated, f16 normal
// or zero: the values do not change the speed).
void store_wide(const attend::Tensor& t, std::int64_t i, float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  switch (t.view().dtype) {
    case DType::bf16: t.as<std::uint16_t>()[i] = static_cast<std::uint16_t>(bits >> 16); return;
    case DType::f16: {
      const std::uint32_t e = (bits >> 23) & 0xff, sign = (bits >> 16) & 0x8000;
      t.as<std::uint16_t>()[i] =
          static_cast<std::uint16_t>(e < 113 ? sign : sign | ((e - 112) << 10) | ((bits >> 13) & 0x3ff));
      return;
    }
    default: t.as<float>()[i] = x; return;
  }
}

// A B=1 cache of `tokens`, its pages in `kv` (8-bit: the appends quantize
// with KVCache's default scales), filled by appending one random 1024-token
// chunk again and again (set-up in seconds even at 128k tokens).
std::unique_ptr<attend::KVCache> make_cache(const Shape& sh, std::int64_t tokens, DType wide, const KvCase& kv) {
  attend::KVCacheConfig c;
  c.dtype = wide;
  if (kv.dtype != wide) c.kv_dtype = kv.dtype;
  c.kv_scale = kv.scale;
  c.heads_kv = sh.hkv;
  c.head_dim_qk = c.head_dim_v = sh.d;
  c.max_seqlen = tokens;
  c.page_size = kPageSize;
  auto cache = std::make_unique<attend::KVCache>(c);
  const std::int64_t chunk = std::min<std::int64_t>(tokens, 1024);
  const attend::Tensor k = attend::Tensor::zeros(wide, {1, chunk, sh.hkv, sh.d});
  const attend::Tensor v = attend::Tensor::zeros(wide, {1, chunk, sh.hkv, sh.d});
  std::uint32_t x = 12345;
  for (std::int64_t i = 0; i < k.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    store_wide(k, i, static_cast<float>(x >> 8) * 0x1p-24f - 0.5f);
    store_wide(v, i, static_cast<float>((x * 747796405u) >> 8) * 0x1p-24f - 0.5f);
  }
  for (std::int64_t t = 0; t < tokens; t += chunk) {
    const std::int64_t n = std::min(chunk, tokens - t);
    cache->append(k, v, std::vector<std::int64_t>{n});
  }
  return cache;
}

// Evicts the last-level cache (a read of 256 MiB, untimed): in a real decode
// step every layer's K/V come from memory, the other layers' having passed
// through the cache since; a small cache (14/2 D=64 at 16k is 8 MiB in bf16)
// would otherwise be timed from a warm LLC.
void flush_llc() {
  static const attend::Tensor buf = [] {
    attend::Tensor t = attend::Tensor::zeros(DType::f32, {std::int64_t{1} << 26});
    std::fill_n(t.as<float>(), t.numel(), 1.0f);
    return t;
  }();
  static volatile float sink;
  const float* a = buf.as<float>();
  const std::int64_t n = buf.numel();
  float total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (std::int64_t i = 0; i < n; i += 16) total += a[i];
  sink = total;
  (void)sink;
}

// One timed call of a backend over a cache: q of sq rows per sequence, causal.
struct Call {
  attend::KVCacheProblem p;
  attend::Tensor q, out, lse;
  std::vector<std::byte> ws;
  const attend::Backend* backend = nullptr;

  Call(const attend::Backend& b, const attend::KVCache& cache, std::int64_t hq, std::int64_t sq) : backend(&b) {
    const attend::KVCacheConfig& c = cache.config();
    q = attend::Tensor::zeros(c.dtype, {1, sq, hq, c.head_dim_qk});
    for (std::int64_t i = 0; i < q.numel(); ++i) store_wide(q, i, static_cast<float>(i % 7) * 0.05f - 0.15f);
    attend::AttentionSpec opts;
    opts.causal = true;
    p = attend::kvcache_problem(q, cache, opts);
    out = attend::Tensor::zeros(c.dtype, {1, sq, hq, c.head_dim_v});
    lse = attend::Tensor::zeros(DType::f32, {1, hq, sq});
    ws.resize(b.workspace_bytes(p.spec, attend::Pass::forward));
  }
  double run() {
    flush_llc();
    const auto t0 = Clock::now();
    backend->forward(attend::ForwardArgs{p.spec, p.inputs, out, lse, attend::Workspace{ws.data(), ws.size()}});
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
};

// Best time of each call over `reps` rounds that run every call once in turn
// (after one untimed round): load from other processes then falls on all of
// them alike rather than on whichever ran during a busy second.
std::vector<double> best_interleaved(std::vector<Call>& calls, int reps) {
  std::vector<double> best(calls.size(), std::numeric_limits<double>::infinity());
  for (Call& c : calls) c.run();
  for (int r = 0; r < reps; ++r) {
    for (std::size_t i = 0; i < calls.size(); ++i) best[i] = std::min(best[i], calls[i].run());
  }
  return best;
}

// K and V bytes a step reads per cached token, scales included (per_head
// scales are read once per step, spread here over the context).
double bytes_per_token(const Shape& sh, DType kv, attend::KVScale scale, std::int64_t context) {
  double b = 2.0 * static_cast<double>(sh.hkv * sh.d) * static_cast<double>(attend::size_of(kv));
  const double scales = 2.0 * static_cast<double>(sh.hkv) * sizeof(float);
  if (scale == attend::KVScale::per_token) b += scales;
  if (scale == attend::KVScale::per_head) b += scales / static_cast<double>(context);
  return b;
}

struct Ratios {
  std::vector<std::vector<double>> per_dtype;  // 8-bit tokens/s / wide tokens/s, per kv dtype
};

// One block of decode rows (every kv dtype at one shape and context).
void decode_rows(const char* tag, const Shape& sh, std::int64_t context, const Kv8Options& o, double read_gbs,
                 const attend::Backend& decode, Ratios& ratios) {
  const DType wide = o.kv_dtypes.front().dtype;
  std::vector<std::unique_ptr<attend::KVCache>> caches;
  std::vector<Call> calls;
  calls.reserve(o.kv_dtypes.size());  // stable addresses: the calls' inputs point at their own q
  for (const KvCase& kv : o.kv_dtypes) caches.push_back(make_cache(sh, context, wide, kv));
  for (const auto& c : caches) calls.emplace_back(decode, *c, sh.hq, 1);
  const std::vector<double> t = best_interleaved(calls, o.reps);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const DType kv = o.kv_dtypes[i].dtype;
    const attend::KVScale scale = caches[i]->scale_layout();
    const double bpt = bytes_per_token(sh, kv, scale, context);
    const double gbs = bpt * static_cast<double>(context) / t[i] / 1e9;
    const double vs = t[0] / t[i];
    if (i > 0) ratios.per_dtype[i].push_back(vs);
    std::printf("%-10s %5lld/%-3lld %4lld %8lld  %-18s %9.3f %9.1f %11.1f %7.2f %8.2f %8.2f\n", tag,
                static_cast<long long>(sh.hq), static_cast<long long>(sh.hkv), static_cast<long long>(sh.d),
                static_cast<long long>(context), name_of(kv, scale).c_str(), t[i] * 1e3, 1.0 / t[i], bpt, gbs,
                gbs / read_gbs, vs);
  }
  std::fflush(stdout);
}

void print_decode_header(const char* tag) {
  std::printf("%-10s %9s %4s %8s  %-18s %9s %9s %11s %7s %8s %8s\n", tag, "heads", "D", "context", "kv_dtype/scale",
              "ms/step", "tokens/s", "bytes/token", "GB/s", "of_read", "vs_wide");
}

double geomean(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += std::log(x);
  return v.empty() ? 0.0 : std::exp(s / static_cast<double>(v.size()));
}

}  // namespace

std::vector<KvCase> parse_kv_dtypes(const char* text) {
  std::string list(text);
  if (list == "all" || list.starts_with("all,")) list.replace(0, 3, "bf16,fp8_e4m3,fp8_e5m2,i8");
  std::vector<KvCase> out;
  DType wide = DType::bf16;
  int wides = 0;
  std::string_view rest(list);
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::size_t slash = item.find('/');
    KvCase c{attend::parse_dtype(item.substr(0, slash), "--kv-dtype"), std::nullopt};
    if (slash != std::string_view::npos) {
      try {
        c.scale = attend::parse_kv_scale(item.substr(slash + 1), "--kv-dtype");
      } catch (const attend::Error& e) {  // name the whole item, not its scale alone
        throw attend::Error(e.code(), "--kv-dtype", std::string(item), e.detail());
      }
      if (!attend::is_kv8(c.dtype) || *c.scale == attend::KVScale::none) {
        throw attend::Error(attend::ErrorCode::invalid_argument, "--kv-dtype", std::string(item),
                            "a scale layout (per_token, per_head, per_tensor) goes with an 8-bit dtype only");
      }
    }
    if (attend::is_kv8(c.dtype)) {
      const auto same = [&](const KvCase& o) { return o.dtype == c.dtype && o.scale == c.scale; };
      if (std::find_if(out.begin(), out.end(), same) == out.end()) out.push_back(c);
    } else if (c.dtype == DType::f32 || c.dtype == DType::bf16 || c.dtype == DType::f16) {
      if (wides++ > 0 && c.dtype != wide) {
        throw attend::Error(attend::ErrorCode::invalid_argument, "--kv-dtype", text,
                            "one wide dtype (the queries' and the baseline's: f32, bf16 or f16) at most");
      }
      wide = c.dtype;
    } else {
      throw attend::Error(attend::ErrorCode::invalid_argument, "--kv-dtype", std::string(item),
                          "a cache holds f32, bf16, f16, fp8_e4m3, fp8_e5m2 or i8");
    }
  }
  out.insert(out.begin(), KvCase{wide, std::nullopt});  // the baseline row comes first
  return out;
}

void run_kv8_section(const Kv8Options& o, double read_gbs) {
  const std::string wide(attend::to_string(o.kv_dtypes.front().dtype));
  const auto decode = attend::make_decode_backend();
  const auto flash = attend::make_flash_backend();
  std::printf(
      "kv8: decode B=1 seqlen_q=1 causal, %s queries, %lld-token pages, 8-bit scales as KVCache's defaults; "
      "the last-level cache flushed before every call (untimed), best of %d interleaved rounds; tokens/s = one "
      "token per step of this one attention layer; bytes/token: K+V+scales read per cached token; of_read: GB/s / "
      "this run's STREAM-like read (%.2f GB/s); vs_wide: tokens/s / the %s cache's\n",
      wide.c_str(), static_cast<long long>(kPageSize), o.reps, read_gbs, wide.c_str());
  Ratios ratios{std::vector<std::vector<double>>(o.kv_dtypes.size())};
  print_decode_header("kv8");
  for (const Shape& sh : kShapes) {
    for (const std::int64_t ctx : o.contexts) decode_rows("kv8", sh, ctx, o, read_gbs, *decode, ratios);
  }
  for (std::size_t i = 1; i < o.kv_dtypes.size(); ++i) {
    const auto& r = ratios.per_dtype[i];
    if (r.empty()) continue;
    std::printf("kv8 summary: %s vs %s tokens/s over %zu shape x context rows: min %.2fx, geomean %.2fx, max %.2fx\n",
                name_of(o.kv_dtypes[i].dtype, o.kv_dtypes[i].scale.value_or(attend::KVScale::none)).c_str(),
                wide.c_str(), r.size(), *std::min_element(r.begin(), r.end()), geomean(r),
                *std::max_element(r.begin(), r.end()));
  }

  if (!o.sweep.empty()) {
    std::printf("kv8 context sweep: heads %lld/%lld D=%lld, same columns\n", static_cast<long long>(kSweepShape.hq),
                static_cast<long long>(kSweepShape.hkv), static_cast<long long>(kSweepShape.d));
    print_decode_header("kv8-sweep");
    Ratios sweep{std::vector<std::vector<double>>(o.kv_dtypes.size())};
    for (const std::int64_t ctx : o.sweep) decode_rows("kv8-sweep", kSweepShape, ctx, o, read_gbs, *decode, sweep);
  }

  if (o.prefill_prefix > 0) {
    // Chunked prefill: the chunk's own K/V are appended first, then its
    // queries attend causally (bottom-right) over prefix + chunk.
    const std::int64_t sk = o.prefill_prefix + o.prefill_chunk;
    const int reps = std::min(o.reps, 5);  // calls of a second or more: fewer rounds suffice
    std::printf(
        "kv8 prefill: flash (%s), B=1, a %lld-token causal query chunk over a %lld-token cached prefix "
        "(Sk=%lld), %s queries, best of %d interleaved rounds; vs_wide_time: this time / the %s cache's\n",
        std::string(attend::flash_active_isa()).c_str(), static_cast<long long>(o.prefill_chunk),
        static_cast<long long>(o.prefill_prefix), static_cast<long long>(sk), wide.c_str(), reps, wide.c_str());
    std::printf("%-11s %8s %4s  %-18s %10s %10s %12s\n", "kv8-prefill", "heads", "D", "kv_dtype/scale", "ms",
                "tokens/s", "vs_wide_time");
    for (const Shape& sh : {kShapes[0], kShapes[3]}) {
      std::vector<std::unique_ptr<attend::KVCache>> caches;
      std::vector<Call> calls;
      calls.reserve(o.kv_dtypes.size());
      for (const KvCase& kv : o.kv_dtypes) caches.push_back(make_cache(sh, sk, o.kv_dtypes.front().dtype, kv));
      for (const auto& c : caches) calls.emplace_back(*flash, *c, sh.hq, o.prefill_chunk);
      const std::vector<double> t = best_interleaved(calls, reps);
      for (std::size_t i = 0; i < calls.size(); ++i) {
        std::printf("%-11s %4lld/%-3lld %4lld  %-18s %10.2f %10.1f %12.2f\n", "kv8-prefill",
                    static_cast<long long>(sh.hq), static_cast<long long>(sh.hkv), static_cast<long long>(sh.d),
                    name_of(o.kv_dtypes[i].dtype, caches[i]->scale_layout()).c_str(), t[i] * 1e3,
                    static_cast<double>(o.prefill_chunk) / t[i], t[i] / t[0]);
      }
      std::fflush(stdout);
    }
  }
}

}  // namespace decode_bench
