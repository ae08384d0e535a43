// decode_bench: split-KV decode against the memory bandwidth measured in the
// same run, against flash on the same problem, and the seqlen_q crossover.
//
//   decode_bench [--tokens N] [--batch B] [--reps R] [--sweep-tokens N] [--no-flash]
//                [--dtype f32|bf16|f16] [--kv-dtype LIST] [--kv-only] [--kv-contexts LIST]
//                [--kv-sweep LIST] [--no-prefill] [--help]
//
// Baseline: a STREAM-like read of a 2 GiB array (every thread sums its part,
// the same OpenMP team decode uses) and a STREAM triad. Decode's rate is the
// K and V bytes of the cache divided by its time (queries and outputs are
// negligible next to them). Default problem: B=8, heads 32/8, D=128, f32,
// 32k cached tokens per sequence in 64-token pages, one query per sequence;
// --dtype bf16|f16 stores the cache (and the queries) in half precision.
// The same problem runs again on dense K/V tensors (the paging's cost is the
// gap), and once on a cache small enough to stay in the last-level cache (the
// kernel's compute cost per key, without the memory wall).
// --kv-dtype adds the 8-bit KV section (decode_kv8.h): fp8 / int8 caches
// against the unquantized one at B=1 on target shapes, a context sweep and a
// chunked prefill, each row's bandwidth against the same baseline.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/decode.h"
#include "attend/backends/flash.h"
#include "decode_kv8.h"

namespace {

using Clock = std::chrono::steady_clock;

template <class Fn>
double best_of(int reps, Fn&& fn) {
  fn();  // warm-up: page faults, thread team start
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

struct Bandwidth {
  double read_gbs = 0, triad_gbs = 0;
  double pattern_gbs = 0;  // decode's order of reads, without its arithmetic
};

// STREAM-like figures over arrays far larger than the last-level cache, and
// the same read array read in decode's order: tokens of `heads` rows of
// `row_bytes` side by side, 16-token blocks, one head's rows of a block at a
// time after asking for its rows of the next block (decode's prefetch hint).
// That order caps a core below the sequential read before any arithmetic
// (docs/cpu_kernels.md), so it is decode's memory ceiling.
Bandwidth measure_bandwidth(int reps, std::size_t row_bytes, std::size_t heads) {
  const std::size_t n = std::size_t{1} << 29;  // 2 GiB of floats for the read test
  // attend's tensors, on the same pages as the caches decode reads (huge ones).
  const attend::Tensor ta = attend::Tensor::zeros(attend::DType::f32, {static_cast<std::int64_t>(n)});
  float* a = ta.as<float>();
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i & 1023);
  volatile float sink = 0;
  const double t_read = best_of(reps, [&] {
    float total = 0;
    // 32 independent partial sums: vectorisable at any -march, never latency-bound.
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (std::size_t blk = 0; blk < n; blk += 4096) {
      float acc[32] = {};
      for (std::size_t i = blk; i < blk + 4096; i += 32) {
        for (int j = 0; j < 32; ++j) acc[j] += a[i + static_cast<std::size_t>(j)];
      }
      for (float x : acc) total += x;
    }
    sink = total;
  });
  const std::size_t row = row_bytes / sizeof(float), token = row * heads;
  const std::size_t blocks = n / token / 16;
  const double t_pattern = best_of(reps, [&] {
    float total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (std::size_t blk = 0; blk < blocks; ++blk) {
      float acc[16] = {};
      const float* base = a + blk * 16 * token;
      for (std::size_t h = 0; h < heads; ++h) {
        if (blk + 1 < blocks) {
          for (std::size_t j = 0; j < 16; ++j) {
            for (std::size_t l = 0; l < row; l += 16) __builtin_prefetch(base + (16 + j) * token + h * row + l, 0, 1);
          }
        }
        for (std::size_t j = 0; j < 16; ++j) {
          const float* r = base + j * token + h * row;
          for (std::size_t l = 0; l + 16 <= row; l += 16) {
            for (int u = 0; u < 16; ++u) acc[u] += r[l + static_cast<std::size_t>(u)];
          }
        }
      }
      for (float x : acc) total += x;
    }
    sink = total;
  });
  (void)sink;
  const std::size_t m = n / 4;  // triad: three 512 MiB arrays
  const attend::Tensor tb = attend::Tensor::zeros(attend::DType::f32, {static_cast<std::int64_t>(m)}),
                       tc = attend::Tensor::zeros(attend::DType::f32, {static_cast<std::int64_t>(m)});
  float *b = tb.as<float>(), *c = tc.as<float>();
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < m; ++i) b[i] = c[i] = 1.0f;
  const double t_triad = best_of(reps, [&] {
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < m; ++i) a[i] = b[i] + 3.0f * c[i];
  });
  return {static_cast<double>(n * sizeof(float)) / t_read / 1e9,
          static_cast<double>(3 * m * sizeof(float)) / t_triad / 1e9,
          static_cast<double>(blocks * 16 * token * sizeof(float)) / t_pattern / 1e9};
}

// x in [-0.5, 0.5) as `dtype` at index i of t (truncated: the values do not
// change the speed).
void store(const attend::Tensor& t, std::int64_t i, float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  switch (t.view().dtype) {
    case attend::DType::bf16: t.as<std::uint16_t>()[i] = static_cast<std::uint16_t>(bits >> 16); return;
    case attend::DType::f16: {  // normal f16 or zero
      const std::uint32_t e = (bits >> 23) & 0xff, sign = (bits >> 16) & 0x8000;
      t.as<std::uint16_t>()[i] =
          static_cast<std::uint16_t>(e < 113 ? sign : sign | ((e - 112) << 10) | ((bits >> 13) & 0x3ff));
      return;
    }
    default: t.as<float>()[i] = x; return;
  }
}

// A cache of `tokens` per sequence, filled by appending one reused random chunk
// (values do not change the speed; this keeps set-up to a few seconds).
attend::KVCache make_cache(std::int64_t batch, std::int64_t hkv, std::int64_t d, std::int64_t tokens,
                           attend::DType dtype) {
  attend::KVCacheConfig c;
  c.dtype = dtype;
  c.batch = batch;
  c.heads_kv = hkv;
  c.head_dim_qk = c.head_dim_v = d;
  c.max_seqlen = tokens;
  c.page_size = 64;
  attend::KVCache cache(c);
  const std::int64_t chunk = std::min<std::int64_t>(tokens, 1024);
  attend::Tensor k = attend::Tensor::zeros(dtype, {batch, chunk, hkv, d});
  attend::Tensor v = attend::Tensor::zeros(dtype, {batch, chunk, hkv, d});
  std::uint32_t x = 12345;
  for (std::int64_t i = 0; i < k.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    store(k, i, static_cast<float>(x >> 8) * 0x1p-24f - 0.5f);
    store(v, i, static_cast<float>((x * 747796405u) >> 8) * 0x1p-24f - 0.5f);
  }
  for (std::int64_t t = 0; t < tokens; t += chunk) {
    std::vector<std::int64_t> counts(static_cast<std::size_t>(batch), std::min(chunk, tokens - t));
    cache.append(k, v, counts);
  }
  return cache;
}

// Random K/V as dense (B, tokens, hkv, d) tensors: one random 1024-token chunk
// repeated along every sequence, as make_cache appends it.
struct DenseKV {
  attend::Tensor k, v;
};
DenseKV make_dense(std::int64_t batch, std::int64_t hkv, std::int64_t d, std::int64_t tokens, attend::DType dtype) {
  DenseKV kv{attend::Tensor::zeros(dtype, {batch, tokens, hkv, d}),
             attend::Tensor::zeros(dtype, {batch, tokens, hkv, d})};
  const std::int64_t chunk = std::min<std::int64_t>(tokens, 1024), row = hkv * d;
  const std::size_t esize = attend::size_of(dtype);
  std::uint32_t x = 12345;
  for (std::int64_t i = 0; i < chunk * row; ++i) {
    x = x * 1664525u + 1013904223u;
    store(kv.k, i, static_cast<float>(x >> 8) * 0x1p-24f - 0.5f);
    store(kv.v, i, static_cast<float>((x * 747796405u) >> 8) * 0x1p-24f - 0.5f);
  }
  for (const attend::Tensor* t : {&kv.k, &kv.v}) {
    auto* base = static_cast<std::byte*>(t->data());
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t t0 = b == 0 ? chunk : 0; t0 < tokens; t0 += chunk) {
        const std::size_t n = static_cast<std::size_t>(std::min(chunk, tokens - t0) * row) * esize;
        std::memcpy(base + static_cast<std::size_t>((b * tokens + t0) * row) * esize, base, n);
      }
    }
  }
  return kv;
}

// Time of one forward of `backend` over the cache with sq queries per sequence;
// with `dense`, the same problem with K/V read from dense tensors instead of
// the cache's pages (the cache then only gives the shapes).
double time_forward(const attend::Backend& backend, const attend::KVCache& cache, std::int64_t heads_q, std::int64_t sq,
                    int reps, const DenseKV* dense = nullptr) {
  const attend::KVCacheConfig& c = cache.config();
  attend::Tensor q = attend::Tensor::zeros(c.dtype, {c.batch, sq, heads_q, c.head_dim_qk});
  for (std::int64_t i = 0; i < q.numel(); ++i) store(q, i, static_cast<float>(i % 7) * 0.05f - 0.15f);
  attend::AttentionSpec opts;
  opts.causal = true;
  attend::KVCacheProblem p = attend::kvcache_problem(q, cache, opts);
  if (dense) {
    p.spec.kv_page_size = 0;
    p.spec.kv_leftpad = false;
    p.spec.seqlen_kv = dense->k.view().shape[1];
    p.inputs.k = dense->k;
    p.inputs.v = dense->v;
    p.inputs.block_table = {};
    p.inputs.cache_seqlens = {};
    p.inputs.cache_leftpad = {};
  }
  attend::Tensor out = attend::Tensor::zeros(c.dtype, {c.batch, sq, heads_q, c.head_dim_v});
  attend::Tensor lse = attend::Tensor::zeros(attend::DType::f32, {c.batch, heads_q, sq});
  std::vector<std::byte> ws(backend.workspace_bytes(p.spec, attend::Pass::forward));
  return best_of(reps, [&] {
    backend.forward(attend::ForwardArgs{p.spec, p.inputs, out, lse, attend::Workspace{ws.data(), ws.size()}});
  });
}

constexpr const char* kUsage =
    "usage: decode_bench [--tokens N] [--batch B] [--reps R] [--sweep-tokens N] [--no-flash] [--dtype f32|bf16|f16]\n"
    "  split-KV decode vs a STREAM-like read bandwidth (a 2 GiB array), vs flash, and the seqlen_q crossover.\n"
    "  --tokens N        cached tokens per sequence (default 32768)\n"
    "  --batch B         sequences (default 8)\n"
    "  --reps R          timed repetitions, best kept (default 5)\n"
    "  --sweep-tokens N  cache length of the crossover sweep (default 4096)\n"
    "  --no-flash        skip flash on the main problem\n"
    "  --dtype D         cache and query dtype (default f32)\n"
    "  --kv-dtype LIST   add the 8-bit KV section: caches in these dtypes, e.g. bf16,fp8_e4m3,fp8_e5m2,i8 or all\n"
    "                    (one wide dtype, default bf16: the queries' and the baseline; 8-bit ones with KVCache's\n"
    "                    default scales, or DTYPE/SCALE, e.g. all,i8/per_head), B=1 at heads 14/2 and 32/8, D=64, 128\n"
    "  --kv-only         with --kv-dtype: skip the sections above (the bandwidth baselines still run)\n"
    "  --kv-contexts L   cached tokens of the 8-bit section's shapes (default 16384,65536)\n"
    "  --kv-sweep L      context sweep at 32/8 D=128 (default 4096,...,131072; none: skip)\n"
    "  --no-prefill      skip the 8-bit section's chunked prefill (512 queries over 16384 cached tokens, flash)\n"
    "Exit codes: 0 success, 1 usage error, 2 attend error.\n";

struct Options {
  std::int64_t batch = 8, tokens = 32768, sweep_tokens = 4096, reps = 5;
  bool no_flash = false;
  attend::DType dtype = attend::DType::f32;
  decode_bench::Kv8Options kv8;  // kv_dtypes empty: no 8-bit section
  bool kv_only = false;
};

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "decode_bench: %s (see --help)\n", why.c_str());
  std::exit(1);
}

// A comma-separated list of positive token counts ("none": empty).
std::vector<std::int64_t> parse_counts(const std::string& flag, const std::string& text) {
  std::vector<std::int64_t> out;
  if (text == "none") return out;
  for (std::size_t pos = 0; pos <= text.size();) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1) usage_error(flag + " '" + text + "' is not a list of positive integers");
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

// Every argument is known or an error: a mistyped flag must not silently start
// the full-size run.
Options parse_args(int argc, char** argv) {
  Options o;
  bool no_prefill = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a == "--no-flash" || a == "--kv-only" || a == "--no-prefill") {
      (a == "--no-flash" ? o.no_flash : a == "--kv-only" ? o.kv_only : no_prefill) = true;
      continue;
    }
    std::int64_t* value = a == "--tokens"         ? &o.tokens
                          : a == "--batch"        ? &o.batch
                          : a == "--reps"         ? &o.reps
                          : a == "--sweep-tokens" ? &o.sweep_tokens
                                                  : nullptr;
    const bool list = a == "--dtype" || a == "--kv-dtype" || a == "--kv-contexts" || a == "--kv-sweep";
    if (value == nullptr && !list) usage_error("unknown flag '" + a + "'");
    if (i + 1 >= argc) usage_error(a + " needs a value");
    const std::string text = argv[++i];
    if (a == "--dtype") {
      o.dtype = attend::parse_dtype(text, "--dtype");
      continue;
    }
    if (a == "--kv-dtype") {
      try {
        o.kv8.kv_dtypes = decode_bench::parse_kv_dtypes(text.c_str());
      } catch (const attend::Error& e) {
        usage_error(e.what());
      }
      continue;
    }
    if (list) {
      (a == "--kv-contexts" ? o.kv8.contexts : o.kv8.sweep) = parse_counts(a, text);
      continue;
    }
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (end == text.c_str() || *end != '\0' || v < 1) usage_error(a + " '" + text + "' is not a positive integer");
    *value = v;
  }
  if (o.kv_only && o.kv8.kv_dtypes.empty()) usage_error("--kv-only needs --kv-dtype (it runs only that section)");
  if (no_prefill) o.kv8.prefill_prefix = 0;
  o.kv8.reps = static_cast<int>(std::min<std::int64_t>(o.reps, 1000));
  return o;
}

void problem_sections(const Options& opt, const Bandwidth& bw);

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse_args(argc, argv);
  const int reps = static_cast<int>(std::min<std::int64_t>(opt.reps, 1000));
  const std::int64_t hkv = 8, d = 128;
  const attend::DType dtype = opt.dtype;
  std::printf("threads: %d  decode isa: %s  flash isa: %s\n", omp_get_max_threads(),
              std::string(attend::decode_active_isa()).c_str(), std::string(attend::flash_active_isa()).c_str());

  const Bandwidth bw =
      measure_bandwidth(reps, static_cast<std::size_t>(d) * attend::size_of(dtype), static_cast<std::size_t>(hkv));
  std::printf("baseline: STREAM-like read %.2f GB/s, triad %.2f GB/s (same process, same threads)\n", bw.read_gbs,
              bw.triad_gbs);
  std::printf(
      "baseline: decode's read order alone (%lld heads x %lld-byte rows per token, 16-token blocks, next "
      "block prefetched, no arithmetic) %.2f GB/s\n",
      static_cast<long long>(hkv), static_cast<long long>(d * static_cast<std::int64_t>(attend::size_of(dtype))),
      bw.pattern_gbs);

  if (!opt.kv_only) problem_sections(opt, bw);
  if (!opt.kv8.kv_dtypes.empty()) decode_bench::run_kv8_section(opt.kv8, bw.read_gbs);
  return 0;
} catch (const attend::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 2;
}

namespace {

// The paged, flash, dense and cache-resident decode lines and the crossover sweep.
void problem_sections(const Options& opt, const Bandwidth& bw) {
  const std::int64_t batch = opt.batch, tokens = opt.tokens, sweep_tokens = opt.sweep_tokens;
  const int reps = static_cast<int>(std::min<std::int64_t>(opt.reps, 1000));
  const std::int64_t hq = 32, hkv = 8, d = 128;
  const attend::DType dtype = opt.dtype;
  const std::string dts(attend::to_string(dtype));
  const char* dt = dts.c_str();
  const auto decode = attend::make_decode_backend({.max_seqlen_q = 1024});
  const auto flash = attend::make_flash_backend();
  const double kv_bytes =
      2.0 * static_cast<double>(batch * tokens * hkv * d) * static_cast<double>(attend::size_of(dtype));
  {
    const attend::KVCache cache = make_cache(batch, hkv, d, tokens, dtype);
    const double t_dec = time_forward(*decode, cache, hq, 1, reps);
    std::printf("decode  B=%lld H=%lld/%lld D=%lld cache=%lld tokens %s (K+V %.2f GiB), seqlen_q=1: %.2f ms, "
                "%.2f GB/s = %.0f%% of read bandwidth\n",
                static_cast<long long>(batch), static_cast<long long>(hq), static_cast<long long>(hkv),
                static_cast<long long>(d), static_cast<long long>(tokens), dt, kv_bytes / (1 << 30), t_dec * 1e3,
                kv_bytes / t_dec / 1e9, 100.0 * kv_bytes / t_dec / 1e9 / bw.read_gbs);
    if (!opt.no_flash) {
      const double t_fl = time_forward(*flash, cache, hq, 1, std::max(1, reps / 2));
      std::printf("flash   same problem: %.2f ms, %.2f GB/s -> decode is %.2fx faster\n", t_fl * 1e3,
                  kv_bytes / t_fl / 1e9, t_fl / t_dec);
    }
  }
  {
    const DenseKV dense = make_dense(batch, hkv, d, tokens, dtype);
    const attend::KVCache shapes = make_cache(batch, hkv, d, 1, dtype);
    const double t_dense = time_forward(*decode, shapes, hq, 1, reps, &dense);
    std::printf("decode  same problem, dense K/V (no pages): %.2f ms, %.2f GB/s = %.0f%% of read bandwidth\n",
                t_dense * 1e3, kv_bytes / t_dense / 1e9, 100.0 * kv_bytes / t_dense / 1e9 / bw.read_gbs);
  }
  {
    // Compute cost without the memory wall: a dense cache small enough to stay
    // in the last-level cache, timed over many calls on one thread (the time
    // one core spends per cached key of one kv head). One thread, because on a
    // busy machine a descheduled team member stretches every short call.
    const std::int64_t small_b = 2, small_tokens = 1024;
    const DenseKV dense = make_dense(small_b, hkv, d, small_tokens, dtype);
    const attend::KVCache shapes = make_cache(small_b, hkv, d, 1, dtype);
    const int team = omp_get_max_threads();
    omp_set_num_threads(1);
    const double t = time_forward(*decode, shapes, hq, 1, 20 * reps, &dense);
    omp_set_num_threads(team);
    std::printf(
        "decode  compute, cache-resident B=%lld cache=%lld tokens dense, 1 thread: %.3f ms, %.1f ns per (key, "
        "kv head)\n",
        static_cast<long long>(small_b), static_cast<long long>(small_tokens), t * 1e3,
        t * 1e9 / static_cast<double>(small_b * small_tokens * hkv));
  }

  // Crossover: causal queries at the end of a shorter cache, decode vs flash.
  const attend::KVCache cache = make_cache(batch, hkv, d, sweep_tokens, dtype);
  std::printf("crossover sweep (B=%lld H=%lld/%lld D=%lld cache=%lld tokens, causal):\n", static_cast<long long>(batch),
              static_cast<long long>(hq), static_cast<long long>(hkv), static_cast<long long>(d),
              static_cast<long long>(sweep_tokens));
  std::printf("  seqlen_q   decode ms   flash ms   flash/decode\n");
  std::int64_t crossover = 0;
  for (std::int64_t sq : {1, 2, 4, 8, 12, 16, 24, 32, 48, 64}) {
    const double td = time_forward(*decode, cache, hq, sq, reps);
    const double tf = time_forward(*flash, cache, hq, sq, reps);
    std::printf("  %8lld   %9.2f   %8.2f   %6.2f\n", static_cast<long long>(sq), td * 1e3, tf * 1e3, tf / td);
    if (crossover == 0 && tf < td) crossover = sq;
  }
  if (crossover) {
    std::printf("flash first wins at seqlen_q=%lld (decode's limit kDecodeMaxSeqlenQ=%lld)\n",
                static_cast<long long>(crossover), static_cast<long long>(attend::kDecodeMaxSeqlenQ));
  } else {
    std::printf("decode wins at every measured seqlen_q (limit kDecodeMaxSeqlenQ=%lld)\n",
                static_cast<long long>(attend::kDecodeMaxSeqlenQ));
  }
}

}  // namespace
