// Google Benchmark view of the same measurements as `attend bench`: flash and
// the unfused OpenBLAS baseline, forward and backward, at a few sequence
// lengths (B=1 H=16 D=128 f32), plus the sgemm ceiling in the same process.
// Counters: GFLOP (runtime/flops.h counts, identical for every implementation),
// shown as a rate (GFLOP=x/s), and extra_MiB. Real time is reported: the kernels are multi-threaded.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "attend/backends/flash.h"
#include "bench/harness.h"
#include "bench/sgemm_peak.h"
#include "bench/unfused.h"
#include "problem_data.h"
#include "runtime/flops.h"

namespace {

namespace ab = attend::bench;
using attend::Pass;

attend::AttentionSpec spec_for(std::int64_t seqlen, bool causal) {
  attend::AttentionSpec s;
  s.batch = 1;
  s.heads_q = s.heads_kv = 16;
  s.head_dim_qk = s.head_dim_v = 128;
  s.seqlen_q = s.seqlen_kv = seqlen;
  s.causal = causal;
  return s;
}

attend_cli::ProblemData data_for(const attend::AttentionSpec& s) {
  attend_cli::Problem p;
  p.spec = s;
  return attend_cli::make_data(p, attend_cli::DataSources{{}, {}, {}, {}, 1, true, {}});
}

void set_counters(benchmark::State& state, const attend::AttentionSpec& s, const attend::Inputs& in, Pass pass,
                  std::size_t extra_bytes) {
  const std::int64_t pairs = attend::detail::visible_pairs(s, in);
  const std::int64_t flops =
      pass == Pass::forward ? attend::detail::forward_flops(s, pairs) : attend::detail::backward_flops(s, pairs);
  state.counters["GFLOP"] =
      benchmark::Counter(static_cast<double>(flops) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["extra_MiB"] = static_cast<double>(extra_bytes) / (1024.0 * 1024.0);
}

attend::Tensor zeros_like_out(const attend::AttentionSpec& s) {
  return attend_cli::zeros(attend::DType::f32, attend_cli::out_shape(s));
}

// Args: {seqlen, causal, pass (0 forward, 1 backward)}.
void BM_flash(benchmark::State& state) {
  const auto s = spec_for(state.range(0), state.range(1) != 0);
  const Pass pass = state.range(2) == 0 ? Pass::forward : Pass::backward;
  const auto backend = attend::make_flash_backend();
  const attend_cli::ProblemData d = data_for(s);
  const attend::Inputs in = d.inputs();
  const attend::Tensor out = zeros_like_out(s);
  const attend::Tensor lse = attend_cli::zeros(attend::DType::f32, attend_cli::lse_shape(s));
  std::vector<float> fwd_ws(backend->workspace_bytes(s, Pass::forward) / sizeof(float) + 1);
  const attend::ForwardArgs fa{s, in, out, lse, {fwd_ws.data(), fwd_ws.size() * sizeof(float)}};
  if (pass == Pass::forward) {
    for (auto _ : state) backend->forward(fa);
  } else {
    backend->forward(fa);
    const auto dq = attend::Tensor::zeros_like(d.q), dk = attend::Tensor::zeros_like(d.k),
               dv = attend::Tensor::zeros_like(d.v);
    std::vector<float> bwd_ws(backend->workspace_bytes(s, Pass::backward) / sizeof(float) + 1);
    const attend::BackwardArgs ba{s,  in, out, lse, d.dout, dq, dk, dv, {}, {bwd_ws.data(), bwd_ws.size() * sizeof(float)}};
    for (auto _ : state) backend->backward(ba);
  }
  set_counters(state, s, in, pass, backend->workspace_bytes(s, pass));
}

void BM_unfused(benchmark::State& state) {
  const auto s = spec_for(state.range(0), state.range(1) != 0);
  const Pass pass = state.range(2) == 0 ? Pass::forward : Pass::backward;
  ab::UnfusedAttention u(s);
  const attend_cli::ProblemData d = data_for(s);
  const attend::Inputs in = d.inputs();
  const attend::Tensor out = zeros_like_out(s);
  if (pass == Pass::forward) {
    for (auto _ : state) u.forward(in, out, false);
  } else {
    u.forward(in, out, true);
    const auto dq = attend::Tensor::zeros_like(d.q), dk = attend::Tensor::zeros_like(d.k),
               dv = attend::Tensor::zeros_like(d.v);
    for (auto _ : state) u.backward(in, d.dout, dq, dk, dv);
  }
  set_counters(state, s, in, pass, u.extra_bytes(pass));
}

// Manual time: each iteration reports the fastest of measure_sgemm_peak's calls
// (data setup excluded), as `attend bench` does.
void BM_sgemm(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  for (auto _ : state) {
    ab::TimingOptions t;
    t.min_time = 0.0;
    t.warmup = 1;
    state.SetIterationTime(ab::measure_sgemm_peak(n, t).best_s);
  }
  state.counters["GFLOP"] = benchmark::Counter(2.0 * static_cast<double>(n * n) * static_cast<double>(n) / 1e9,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

void attention_args(benchmark::internal::Benchmark* b) {
  for (const std::int64_t seqlen : {1024, 2048, 4096}) {
    for (const std::int64_t causal : {0, 1}) {
      for (const std::int64_t pass : {0, 1}) b->Args({seqlen, causal, pass});
    }
  }
  b->ArgNames({"S", "causal", "bwd"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_sgemm)->Arg(2048)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_flash)->Apply(attention_args);
BENCHMARK(BM_unfused)->Apply(attention_args);

}  // namespace

int main(int argc, char** argv) {
  benchmark::AddCustomContext("blas_config", ab::blas_config());
  benchmark::AddCustomContext("flash_isa", std::string(attend::flash_active_isa()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
