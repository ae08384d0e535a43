#include "sgemm_peak.h"

#include <cblas.h>

#include <algorithm>
#include <random>
#include <span>

#include "attend/error.h"
#include "attend/tensor.h"

// Declared here as well as (in some versions) in cblas.h: the exact signature
// OpenBLAS exports, so that the call links whatever header is found.
extern "C" char* openblas_get_config(void);
extern "C" int openblas_get_num_threads(void);

namespace attend::bench {

SgemmPeak measure_sgemm_peak(std::int64_t n, const TimingOptions& options) {
  if (n <= 0 || n > 65536) {
    throw Error(ErrorCode::invalid_argument, "sgemm_n", std::to_string(n), "must be in [1, 65536]");
  }
  const auto count = static_cast<std::size_t>(n * n);
  // attend's tensors: the same pages (huge ones at this size) as the inputs
  // of the kernels this peak is compared with.
  const Tensor ta = Tensor::zeros(DType::f32, {n, n}), tb = Tensor::zeros(DType::f32, {n, n}),
               tc = Tensor::zeros(DType::f32, {n, n});
  const std::span<float> a(ta.as<float>(), count), b(tb.as<float>(), count), c(tc.as<float>(), count);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  const auto dim = static_cast<blasint>(n);
  TimingOptions t = options;
  t.min_reps = std::max(t.min_reps, 5);
  const Timing timing = time_it(
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, dim, dim, dim, 1.0f, a.data(), dim, b.data(), dim,
                    0.0f, c.data(), dim);
      },
      t);
  SgemmPeak peak;
  peak.n = n;
  peak.best_s = timing.best_s;
  peak.reps = timing.reps;
  peak.gflops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / timing.best_s / 1e9;
  return peak;
}

std::string blas_config() {
  const char* config = openblas_get_config();
  return config != nullptr ? std::string(config) : std::string("unknown");
}

int blas_threads() { return openblas_get_num_threads(); }

}  // namespace attend::bench
