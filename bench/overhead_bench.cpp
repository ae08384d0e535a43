// overhead_bench: what the runtime costs per call on a problem whose kernel is
// tiny — one query over 64 cached keys, the shape of a token-by-token decode
// step — so that selection, validation and allocation dominate.
//
//   overhead_bench [--reps N] [--heads H] [--head-dim D] [--keys K]
//
// Rows (microseconds per call, median of --reps calls after a warm-up):
//   kernel      decode's forward through Backend::forward with outputs and
//               workspace allocated once (the floor: validation + check + kernel)
//   api         attend::forward(q, k, v, spec, inference): select (cached),
//               allocate outputs, run
//   kvcache     attend::forward_with_kvcache after appending one token to the
//               cache (untimed), so the key count grows every call as in a
//               decode loop; it stays within 64..128 keys (the cache is reset
//               and refilled, untimed) so the kernel stays tiny
//   plan        attend::Plan::forward of a plan made once, outputs given
// overhead = api - kernel is what the public entry point adds per call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/decode.h"
#if __has_include("attend/plan.h")
#define ATTEND_HAVE_PLAN 1
#endif

namespace {

using Clock = std::chrono::steady_clock;

template <class Fn>
double median_us(int reps, Fn&& fn) {
  for (int i = 0; i < 50; ++i) fn();  // warm-up: thread team, caches, page faults
  std::vector<double> t(static_cast<std::size_t>(reps));
  for (auto& x : t) {
    const auto t0 = Clock::now();
    fn();
    x = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[static_cast<std::size_t>(reps / 2)];
}

std::vector<float> random_floats(std::int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 2000;
  std::int64_t heads = 8, dim = 64, keys = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(1);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--reps") reps = static_cast<int>(next());
    else if (a == "--heads") heads = next();
    else if (a == "--head-dim") dim = next();
    else if (a == "--keys") keys = next();
    else if (a == "--help" || a == "-h") {
      std::puts("overhead_bench [--reps N] [--heads H] [--head-dim D] [--keys K]");
      return 0;
    } else {
      std::fprintf(stderr, "unknown flag %s (see --help)\n", a.c_str());
      return 1;
    }
  }
  if (reps < 1 || heads < 1 || dim < 1 || keys < 1) {
    std::fputs("every value must be >= 1\n", stderr);
    return 1;
  }

  attend::AttentionSpec spec;
  spec.batch = 1;
  spec.seqlen_q = 1;
  spec.seqlen_kv = keys;
  spec.heads_q = spec.heads_kv = heads;
  spec.head_dim_qk = spec.head_dim_v = dim;
  spec.causal = true;

  std::vector<float> q = random_floats(heads * dim, 1);
  std::vector<float> k = random_floats(keys * heads * dim, 2);
  std::vector<float> v = random_floats(keys * heads * dim, 3);
  const auto view = [&](std::vector<float>& x, std::int64_t s) {
    return attend::TensorView::contiguous(x.data(), attend::DType::f32, {1, s, heads, dim});
  };
  const attend::TensorView qv = view(q, 1), kv = view(k, keys), vv = view(v, keys);

  // kernel: decode through the Backend interface, buffers allocated once.
  const auto decode = attend::make_decode_backend();
  attend::Tensor out = attend::Tensor::zeros(attend::DType::f32, {1, 1, heads, dim});
  attend::Tensor lse = attend::Tensor::zeros(attend::DType::f32, {1, heads, 1});
  std::vector<std::byte> ws(decode->workspace_bytes(spec, attend::Pass::forward));
  attend::Inputs in;
  in.q = qv;
  in.k = kv;
  in.v = vv;
  const double kernel = median_us(reps, [&] {
    decode->forward(attend::ForwardArgs{spec, in, out, lse, {ws.data(), ws.size()}});
  });

  std::string chosen;
  const double api = median_us(reps, [&] {
    auto r = attend::forward(qv, kv, vv, spec, attend::Mode::inference);
    if (chosen.empty()) chosen = std::string(r.ctx.backend().name());
  });

  // kvcache: the key count grows by one per call, as in generation.
  attend::KVCacheConfig cfg;
  cfg.batch = 1;
  cfg.heads_kv = heads;
  cfg.head_dim_qk = cfg.head_dim_v = dim;
  cfg.page_size = 64;
  cfg.max_seqlen = 2 * keys + 64;
  attend::KVCache cache(cfg);
  std::vector<float> k1 = random_floats(heads * dim, 4), v1 = random_floats(heads * dim, 5);
  const attend::TensorView k1v = view(k1, 1), v1v = view(v1, 1);
  attend::AttentionSpec opts;
  opts.causal = true;
  std::vector<double> steps;
  for (int r = 0; r < reps + 50; ++r) {
    if (cache.length(0) == 0 || cache.length(0) >= 2 * keys) {
      cache.reset(0);
      cache.append(kv, vv);
    }
    cache.append(k1v, v1v);
    const auto t0 = Clock::now();
    attend::forward_with_kvcache(qv, cache, opts);
    if (r >= 50) steps.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::nth_element(steps.begin(), steps.begin() + reps / 2, steps.end());
  const double step = steps[static_cast<std::size_t>(reps / 2)];

#ifdef ATTEND_HAVE_PLAN
  const attend::Plan plan = attend::Plan::make(spec, attend::Mode::inference);
  std::vector<std::byte> plan_ws(plan.workspace_bytes(attend::Pass::forward));
  const double planned = median_us(reps, [&] { plan.forward(in, out, lse, {{plan_ws.data(), plan_ws.size()}}); });
#endif

  std::printf("overhead_bench: B=1 Sq=1 Sk=%lld H=%lld/%lld D=%lld f32 causal, %d reps (median)\n",
              static_cast<long long>(keys), static_cast<long long>(heads), static_cast<long long>(heads),
              static_cast<long long>(dim), reps);
  std::printf("backend (api): %s\n", chosen.c_str());
  std::printf("kernel   %8.2f us/call  (Backend::forward, buffers allocated once)\n", kernel);
  std::printf("api      %8.2f us/call  (attend::forward)\n", api);
  std::printf("kvcache  %8.2f us/call  (forward_with_kvcache, keys grow by one per call)\n", step);
#ifdef ATTEND_HAVE_PLAN
  std::printf("plan     %8.2f us/call  (Plan::forward, plan made once, outputs given)\n", planned);
#endif
  std::printf("overhead %8.2f us/call  (api - kernel)\n", api - kernel);
  return 0;
}
