#include "bf16_gemm_peak.h"

#include <algorithm>
#include <random>
#include <string>

#include "attend/error.h"

#if ATTEND_BENCH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace attend::bench {

Bf16GemmPeak measure_bf16_gemm_peak(std::int64_t n, const TimingOptions& options) {
  if (n <= 0 || n > 65536) {
    throw Error(ErrorCode::invalid_argument, "bf16_gemm_n", std::to_string(n), "must be in [1, 65536]");
  }
  Bf16GemmPeak peak;
  peak.n = n;
#if ATTEND_BENCH_ONEDNN
  using dnnl::memory;
  // oneDNN before 3.x leaves AMX off unless asked (ONEDNN_MAX_CPU_ISA); ask for
  // everything the CPU has, as PyTorch does.
  // Allowed once per process, before oneDNN's first primitive: a second
  // measurement finds it set already.
  try {
    dnnl::set_max_cpu_isa(dnnl::cpu_isa::all);
  } catch (const dnnl::error&) {
  }
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  // Below AVX512-BF16 oneDNN converts bf16 to f32 in software: a figure then,
  // but not a bf16 GEMM rate worth comparing with.
  const bool native =
      isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx || isa == dnnl::cpu_isa::all;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const memory::dims dims{n, n};
  const memory::desc a(dims, memory::data_type::bf16, memory::format_tag::ab);
  const memory::desc b(dims, memory::data_type::bf16, memory::format_tag::ab);
  const memory::desc c(dims, memory::data_type::f32, memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);
  peak.impl = pd.impl_info_str();
  if (!native) {
    peak.impl += " (no bf16 GEMM instructions on this CPU: not measured)";
    return peak;
  }
  memory ma(a, eng), mb(b, eng), mc(c, eng);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> bits(0x3f00, 0x3fff);  // bf16 values in [0.5, 2)
  for (memory* m : {&ma, &mb}) {
    auto* words = static_cast<std::uint16_t*>(m->get_data_handle());
    std::generate(words, words + n * n, [&] { return static_cast<std::uint16_t>(bits(rng)); });
  }
  const dnnl::matmul mm(pd);
  TimingOptions t = options;
  t.min_reps = std::max(t.min_reps, 5);
  const Timing timing = time_it(
      [&] {
        mm.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
        stream.wait();
      },
      t);
  peak.best_s = timing.best_s;
  peak.reps = timing.reps;
  peak.gflops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / timing.best_s / 1e9;
#else
  (void)options;
  peak.impl = "oneDNN not in this build (libdnnl-dev): not measured";
#endif
  return peak;
}

}  // namespace attend::bench
