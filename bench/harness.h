// The benchmark harness: every (problem, implementation, pass) measured in one
// process, next to a measured sgemm ceiling and the unfused baseline, so that
// every rate is read as a ratio against baselines run on the same machine state.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "amx_peak.h"
#include "attend/backend.h"
#include "attend/kvcache.h"
#include "attend/spec.h"
#include "attend/tensor.h"
#include "bf16_gemm_peak.h"
#include "sgemm_peak.h"
#include "timing.h"

namespace attend::bench {

// What a row measures: any registered backend (through the Backend interface),
// optionally one of its variants ("flash:avx2"), "unfused" (UnfusedAttention,
// unfused.h), or the public entry points ("api": attend::forward/backward,
// selecting and allocating their outputs on every call; "api:given": the
// caller passes out/lse/gradients in CallOptions). A new backend can be
// benchmarked without editing the harness.
struct Impl {
  std::string backend;  // a registered backend's name, "unfused" or "api"
  std::string variant;  // one of its variants (api: "given"); empty: its default under the policy
  static const Impl flash, reference, unfused, api, api_given;
  bool is_unfused() const { return backend == "unfused"; }
  bool is_api() const { return backend == "api"; }
  bool operator==(const Impl&) const = default;
};
std::string to_string(const Impl& impl);  // "flash", "flash:avx2", "unfused", "api:given"
// "unfused", "api", "api:given", or a registered backend name with an optional ":variant"; throws
// attend::Error(invalid_argument) naming the registered backends otherwise.
Impl parse_impl(std::string_view text);

// The input tensors of one problem, owned; in spec.dtype and spec.layout.
struct ProblemTensors {
  Tensor q, k, v, dout;                       // dout: out's shape, needed for backward
  Tensor bias, slopes, cu_seqlens_q, cu_seqlens_kv;  // when the spec asks for them
  // spec.paged(): the KV cache whose page pools replace k and v as the
  // kernels' inputs (KVCache::bind).
  std::shared_ptr<const KVCache> cache;
  Tensor k_scale, v_scale;  // 8-bit dense k/v (spec.kv_scale != none): their f32 scales
  Inputs inputs() const;
};
// Makes the tensors of a spec. The harness does not generate data itself: the
// CLI passes its own generator (cli/problem_data.h), tests pass theirs.
using MakeTensors = std::function<ProblemTensors(const AttentionSpec&)>;

struct HarnessOptions {
  std::vector<Impl> impls{Impl::flash, Impl::unfused};
  std::vector<Pass> passes{Pass::forward, Pass::backward};
  TimingOptions timing;
  // The reference materialises scores in f64 and is slow: it is skipped (with a
  // note) when B*H*Sq*Sk exceeds this, unless force_reference.
  std::int64_t reference_max_work = std::int64_t{1} << 26;
  bool force_reference = false;
  MakeTensors make_tensors;           // required
  std::ostream* progress = nullptr;   // one line per measurement ("[3/12] ..."); nullptr: none
};

// Values that hold for the whole run; printed above the table and repeated in
// the CSV/JSON.
struct Header {
  int threads = 0;          // omp_get_max_threads()
  int blas_threads = 0;     // openblas_get_num_threads()
  std::string flash_isa;    // attend::flash_active_isa()
  std::string blas_config;  // openblas_get_config()
  // "OPENBLAS_CORETYPE=X OPENBLAS_L2_SIZE=Y" (those set) when the environment
  // pins OpenBLAS's kernel: then the sgemm baseline is not what OpenBLAS would
  // pick for this CPU and every vs_sgemm ratio says so. Empty: not pinned.
  std::string blas_pinned;
  SgemmPeak sgemm;
  Bf16GemmPeak bf16_gemm;  // the bf16 rows' ceiling (vs_bf16_gemm); may be unmeasured
  AmxPeak amx;             // the AMX unit's register-only rate (vs_amx_peak); may be unmeasured
};
// Fills everything but the peaks from the running process.
Header make_header(const SgemmPeak& sgemm, const Bf16GemmPeak& bf16_gemm = {}, const AmxPeak& amx = {});
// The blas_pinned text for these variable values (null: unset).
std::string blas_pinning(const char* coretype, const char* l2_size);

// A measurement whose median exceeds its best by more than this factor ran on
// a machine too busy to trust its ratios: the report flags it.
inline constexpr double kNoisySpread = 2.0;

struct Row {
  AttentionSpec spec;
  std::string problem;  // problem_label(spec)
  Impl impl = Impl::flash;
  Pass pass = Pass::forward;
  Timing timing;
  std::int64_t flops = 0;      // runtime/flops.h: exact visible pairs, same count for every impl
  double gflops = 0.0;         // flops / timing.best_s / 1e9
  double vs_sgemm = 0.0;       // gflops / header.sgemm.gflops
  double vs_unfused = std::numeric_limits<double>::quiet_NaN();  // unfused best / this best (same
                                                                  // problem and pass); NaN: not measured
  std::size_t extra_bytes = 0; // flash/reference: workspace_bytes; unfused: extra_bytes(pass)
  // bf16 rows: gflops / header.bf16_gemm.gflops; NaN for other dtypes or
  // without a measured bf16 peak.
  double vs_bf16_gemm = std::numeric_limits<double>::quiet_NaN();
  // bf16 rows: gflops / header.amx.gflops (ratio_to_amx_peak); NaN likewise.
  double vs_amx_peak = std::numeric_limits<double>::quiet_NaN();
  bool noisy() const { return timing.median_s > kNoisySpread * timing.best_s; }
};

struct Report {
  Header header;
  std::vector<Row> rows;
  std::vector<std::string> notes;  // skipped measurements and why
};

// "B=1 H=16 D=128 S=4096 causal" — only what differs from the plain case is added
// (H=16/4 for GQA, D=192/128 for unequal dims, Sq=../Sk=.. when they differ,
// window=L,R, and the other spec features by name).
std::string problem_label(const AttentionSpec& spec);

// Measures every problem x impl x pass the options ask for (impl-major within
// a problem: forward, then backward on the forward's outputs). Problems or
// passes an implementation does not support are skipped with a note.
Report run_benchmarks(const std::vector<AttentionSpec>& problems, const HarnessOptions& options,
                      const Header& header);

}  // namespace attend::bench
