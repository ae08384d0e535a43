// cuda_bench: the cuda backend's forward and backward on the GPU, timed with
// CUDA events, against cuBLAS GEMM peaks measured in the same process, and the
// cudnn backend (cuDNN's fused SDPA) on the same problems where it is built.
//
//   cuda_bench [--quick] [--reps N] [--warmup N] [--gemm-n N] [--help]
//
// Rows: B=4, H=16, D in {64, 128}, S in {1024, 2048, 4096} (--quick: 1024),
// non-causal and causal, f32 and bf16, through the Backend interface with
// device workspace given up front; one row per backend (cuda's variants,
// cudnn) that accepts the pass, a "skipped" row with the reasons otherwise. FLOPs are src/runtime/flops.h's exact
// visible (query, key) pairs, as `attend bench` counts them: per head forward
// 4*Sq*Sk*D and backward 10*Sq*Sk*D (2.5x) without a mask, (S+1)/(2S) of that
// when causal. Time: best and median of --reps (5) calls after --warmup (2);
// TFLOP/s from the best.
//
// Baseline: cuBLAS, loaded with dlopen (no link dependency; absent, the rows
// still print): an n^3 SGEMM (f32 on CUDA cores: cuBLAS's default math mode
// uses no TF32), and a bf16 GemmEx with f32 accumulation (tensor cores), n =
// --gemm-n (8192). vs_gemm is a row's TFLOP/s over the GEMM of its dtype.
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/cuda.h"
#include "runtime/flops.h"

namespace {

using attend::AttentionSpec;
using attend::DType;
using attend::Pass;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                             ")");
  }
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) {
    check(cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 256)), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { (void)cudaFree(ptr_); }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

struct Timing {
  double best_ms = 0, median_ms = 0;
};

// `fn` queues its work on the default stream; the events bracket it there.
template <class Fn>
Timing time_on_device(int warmup, int reps, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  try {
    for (int r = 0; r < reps; ++r) {
      check(cudaEventRecord(start, nullptr), "cudaEventRecord");
      fn();
      check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "timed run");
      float t = 0;
      check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
      ms.push_back(t);
    }
  } catch (...) {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    throw;
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  return {ms[0], n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2};
}

// Random inputs, uploaded from one host pool (f32 and its bf16 rounding).
struct HostPool {
  std::vector<float> f32;
  std::vector<std::uint16_t> bf16;

  explicit HostPool(std::size_t n) : f32(n), bf16(n) {
    std::uint64_t x = 0x9E3779B97F4A7C15ull;
    for (std::size_t i = 0; i < n; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      f32[i] = static_cast<float>(static_cast<double>(x >> 11) * 0x1.0p-53 * 2.0 - 1.0);  // [-1, 1)
      std::uint32_t u = 0;
      std::memcpy(&u, &f32[i], sizeof u);
      bf16[i] = static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);  // nearest even
    }
  }
  // `count` elements of `dtype` starting at element `offset` into device memory at `dst`.
  void upload(void* dst, DType dtype, std::size_t count, std::size_t offset) const {
    const void* src = dtype == DType::bf16 ? static_cast<const void*>(bf16.data() + offset)
                                           : static_cast<const void*>(f32.data() + offset);
    check(cudaMemcpy(dst, src, count * attend::size_of(dtype), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
};

// cuBLAS through dlopen: the few entry points the baseline calls.
struct Cublas {
  using Create = cublasStatus_t (*)(cublasHandle_t*);
  using Destroy = cublasStatus_t (*)(cublasHandle_t);
  using Sgemm = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*,
                                   const float*, int, const float*, int, const float*, float*, int);
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  std::string library, error;  // error non-empty: unavailable
  Create create = nullptr;
  Destroy destroy = nullptr;
  Sgemm sgemm = nullptr;
  GemmEx gemm_ex = nullptr;
  cublasHandle_t handle = nullptr;

  bool ok() const { return error.empty(); }
};

template <class Fn>
Fn symbol(void* lib, const char* name, std::string& error) {
  void* p = dlsym(lib, name);
  if (!p && error.empty()) error = std::string("no symbol ") + name;
  return reinterpret_cast<Fn>(p);
}

// Never dlclosed: cuBLAS keeps state until process exit.
Cublas load_cublas() {
  Cublas c;
  void* lib = nullptr;
  std::string tried;
  for (const char* name : {"libcublas.so.13", "libcublas.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      c.library = name;
      break;
    }
    const char* why = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (why ? why : name);
  }
  if (!lib) {
    c.error = tried;
    return c;
  }
  c.create = symbol<Cublas::Create>(lib, "cublasCreate_v2", c.error);
  c.destroy = symbol<Cublas::Destroy>(lib, "cublasDestroy_v2", c.error);
  c.sgemm = symbol<Cublas::Sgemm>(lib, "cublasSgemm_v2", c.error);
  c.gemm_ex = symbol<Cublas::GemmEx>(lib, "cublasGemmEx", c.error);
  if (!c.ok()) return c;
  const cublasStatus_t st = c.create(&c.handle);
  if (st != CUBLAS_STATUS_SUCCESS) c.error = "cublasCreate_v2 returned status " + std::to_string(static_cast<int>(st));
  return c;
}

// n^3 GEMM TFLOP/s of `dtype` (f32: SGEMM; bf16: GemmEx, f32 accumulation); 0 when cuBLAS failed (printed).
double gemm_peak(const Cublas& cublas, const HostPool& pool, DType dtype, int n, int warmup, int reps) {
  const std::size_t elems = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  const DeviceBuffer a(elems * attend::size_of(dtype)), c(elems * attend::size_of(dtype));
  pool.upload(a.get(), dtype, elems, 0);
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  const auto run = [&] {
    cublasStatus_t st;
    if (dtype == DType::f32) {
      const auto* m = static_cast<const float*>(a.get());
      st = cublas.sgemm(cublas.handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, m, n, m, n, &beta,
                        static_cast<float*>(c.get()), n);
    } else {
      st = cublas.gemm_ex(cublas.handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n, a.get(),
                          CUDA_R_16BF, n, &beta, c.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    if (st != CUBLAS_STATUS_SUCCESS && status == CUBLAS_STATUS_SUCCESS) status = st;
  };
  const Timing t = time_on_device(warmup, reps, run);
  const char* label = dtype == DType::f32 ? "f32 " : "bf16";
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::printf("gemm %s n=%d failed: cuBLAS status %d\n", label, n, static_cast<int>(status));
    return 0;
  }
  const double tflops = 2.0 * n * static_cast<double>(n) * n / (t.best_ms * 1e-3) / 1e12;
  std::printf("gemm %s n=%d best_ms=%.3f median_ms=%.3f TFLOP/s=%.2f\n", label, n, t.best_ms, t.median_ms, tflops);
  return tflops;
}

struct Options {
  bool quick = false;
  int reps = 5, warmup = 2, gemm_n = 8192;
};

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: cuda_bench [--quick] [--reps N] [--warmup N] [--gemm-n N]\n"
               "  --quick     S=1024 only (default: 1024, 2048, 4096)\n"
               "  --reps N    timed calls per row (default 5; best and median reported)\n"
               "  --warmup N  untimed calls before them (default 2)\n"
               "  --gemm-n N  cuBLAS GEMM size of the baseline (default 8192)\n");
}

int positive(const char* flag, const char* value) {
  char* end = nullptr;
  const long v = value ? std::strtol(value, &end, 10) : 0;
  if (!value || *end != '\0' || v < 1 || v > 1000000) {
    std::fprintf(stderr, "cuda_bench: %s needs a positive integer\n", flag);
    std::exit(2);
  }
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--reps") {
      o.reps = positive("--reps", next);
      ++i;
    } else if (a == "--warmup") {
      o.warmup = positive("--warmup", next);
      ++i;
    } else if (a == "--gemm-n") {
      o.gemm_n = positive("--gemm-n", next);
      ++i;
    } else if (a == "--help" || a == "-h") {
      usage(stdout);
      std::exit(0);
    } else {
      std::fprintf(stderr, "cuda_bench: unknown argument %s\n", a.c_str());
      usage(stderr);
      std::exit(2);
    }
  }
  return o;
}

struct Shape {
  DType dtype;
  std::int64_t d, s;
  bool causal;
};

// One problem: a forward row and a backward row.
void run_problem(const attend::Backend& backend, const HostPool& pool, const Shape& sh, const Options& o, double peak) {
  AttentionSpec s;
  s.batch = 4;
  s.heads_q = s.heads_kv = 16;
  s.seqlen_q = s.seqlen_kv = sh.s;
  s.head_dim_qk = s.head_dim_v = sh.d;
  s.causal = sh.causal;
  s.dtype = sh.dtype;
  const attend::Target target{attend::Device::cuda(0), -1};
  const std::int64_t pairs = s.batch * attend::detail::visible_pairs(s, s.seqlen_q, s.seqlen_kv);  // dense: B x one
  char prefix[128];
  const auto row_prefix = [&](Pass pass, int variant) {
    std::snprintf(prefix, sizeof prefix, "%-6s %-8s  %-7s  %-5s %2lld %3lld %5lld %4lld  %-6s",
                  std::string(backend.name()).c_str(), std::string(to_string(pass)).c_str(),
                  variant < 0 ? "-" : backend.variants()[static_cast<std::size_t>(variant)].name.c_str(),
                  std::string(to_string(s.dtype)).c_str(), static_cast<long long>(s.batch),
                  static_cast<long long>(s.heads_q), static_cast<long long>(sh.s), static_cast<long long>(sh.d),
                  sh.causal ? "yes" : "no");
    return prefix;
  };
  const auto print_row = [&](Pass pass, int variant, const Timing& t) {
    const std::int64_t flops =
        pass == Pass::forward ? attend::detail::forward_flops(s, pairs) : attend::detail::backward_flops(s, pairs);
    const double tflops = static_cast<double>(flops) / (t.best_ms * 1e-3) / 1e12;
    char ratio[32] = "-";
    if (peak > 0) std::snprintf(ratio, sizeof ratio, "%.3f", tflops / peak);
    std::printf("%s  %9.3f  %9.3f  %8.2f  %s\n", row_prefix(pass, variant), t.best_ms, t.median_ms, tflops, ratio);
  };

  const auto declined = [&](Pass pass) {
    const attend::Support sup = backend.check(s, pass, target);
    if (!sup.ok()) std::printf("%s  skipped: %s\n", row_prefix(pass, -1), sup.to_string().c_str());
    return !sup.ok();
  };
  // Every variant that takes the pass gets its own row.
  const auto each_variant = [&](Pass pass, auto&& body) {
    for (std::size_t vi = 0; vi < backend.variants().size(); ++vi) {
      const attend::Target t{attend::Device::cuda(0), static_cast<int>(vi)};
      if (backend.check(s, pass, t, attend::Support::Detail::codes).ok()) body(static_cast<int>(vi), t);
    }
  };
  if (declined(Pass::forward)) return;

  const std::size_t numel = static_cast<std::size_t>(s.batch * s.seqlen_q * s.heads_q * s.head_dim_qk);
  const std::size_t bytes = numel * attend::size_of(s.dtype);
  const DeviceBuffer q(bytes), k(bytes), v(bytes), out(bytes), dout(bytes), dq(bytes), dk(bytes), dv(bytes);
  const DeviceBuffer lse(static_cast<std::size_t>(s.batch * s.heads_q * s.seqlen_q) * sizeof(float));
  pool.upload(q.get(), s.dtype, numel, 0);
  pool.upload(k.get(), s.dtype, numel, 1);
  pool.upload(v.get(), s.dtype, numel, 2);
  pool.upload(dout.get(), s.dtype, numel, 3);
  const auto view = [&](const DeviceBuffer& b) {
    attend::TensorView t =
        attend::TensorView::contiguous(b.get(), s.dtype, {s.batch, s.seqlen_q, s.heads_q, s.head_dim_qk});
    t.device = attend::Device::cuda(0);
    return t;
  };
  attend::Inputs in;
  in.q = view(q);
  in.k = view(k);
  in.v = view(v);
  attend::TensorView lse_view = attend::TensorView::contiguous(lse.get(), DType::f32, {s.batch, s.heads_q, s.seqlen_q});
  lse_view.device = attend::Device::cuda(0);
  const attend::TensorView out_view = view(out);

  const std::size_t fws = backend.workspace_bytes(s, Pass::forward, target);
  const DeviceBuffer fw(fws);
  const attend::ForwardArgs fargs{s, in, out_view, lse_view, attend::Workspace{fw.get(), fws}, target, {}};
  each_variant(Pass::forward, [&](int vi, const attend::Target& t) {
    attend::ForwardArgs a = fargs;
    a.target = t;
    print_row(Pass::forward, vi, time_on_device(o.warmup, o.reps, [&] { backend.forward(a); }));
  });

  if (declined(Pass::backward)) return;
  backend.forward(fargs);  // out and lse for the backward
  const std::size_t bws = backend.workspace_bytes(s, Pass::backward, target);
  const DeviceBuffer bw(bws);
  const attend::BackwardArgs bargs{s,        in,       out_view, lse_view, view(dout),
                                   view(dq), view(dk), view(dv), {},       attend::Workspace{bw.get(), bws},
                                   target,   {}};
  each_variant(Pass::backward, [&](int vi, const attend::Target& t) {
    attend::BackwardArgs a = bargs;
    a.target = t;
    print_row(Pass::backward, vi, time_on_device(o.warmup, o.reps, [&] { backend.backward(a); }));
  });
}

int run(const Options& o) {
  // cuda, and cudnn where this build has it (found by name: no link-time dependency on it).
  std::vector<std::shared_ptr<const attend::Backend>> backends{attend::make_cuda_backend()};
  if (auto cudnn = attend::Registry::global().find("cudnn")) backends.push_back(cudnn);
  const auto& backend = backends.front();
  if (attend::cuda_device_count() == 0) {
    std::fprintf(stderr, "cuda_bench: nothing to measure: the CUDA runtime reports no device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d, %d SMs, %.0f GiB)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  for (const attend::Variant& v : backend->variants())
    std::printf("variant %s: %s\n", v.name.c_str(), v.summary.c_str());
  std::printf("cudnn: %s\n", backends.size() > 1 ? "built; its rows follow cuda's (bf16 only: it declines f32)"
                                                 : "not built into this libattend (ATTEND_CUDNN)");
  // What the selector says for device tensors: MLA head dims (192/128) have a
  // forward here but no backward, so training declines cuda and inference takes it.
  {
    attend::AttentionSpec mla;
    mla.batch = 2;
    mla.seqlen_q = mla.seqlen_kv = 1024;
    mla.heads_q = mla.heads_kv = 16;
    mla.head_dim_qk = 192;
    mla.head_dim_v = 128;
    mla.causal = true;
    for (attend::Mode mode : {attend::Mode::training, attend::Mode::inference}) {
      std::printf("%s",
                  attend::evaluate(mla, mode, attend::current_policy(), attend::Device::cuda(0)).explain().c_str());
    }
  }
  std::printf("timing: best and median of %d calls after %d warm-up calls, CUDA events on the default stream\n", o.reps,
              o.warmup);
  std::printf("flops: runtime/flops.h, visible pairs x heads x (forward 4*D, backward 10*D); TFLOP/s from best_ms\n");

  const std::vector<std::int64_t> seqlens =
      o.quick ? std::vector<std::int64_t>{1024} : std::vector<std::int64_t>{1024, 2048, 4096};
  const std::int64_t max_numel = 4 * 16 * seqlens.back() * 128;
  const std::size_t gemm_elems = static_cast<std::size_t>(o.gemm_n) * static_cast<std::size_t>(o.gemm_n);
  const HostPool pool(std::max(static_cast<std::size_t>(max_numel) + 3, gemm_elems));

  const Cublas cublas = load_cublas();
  double peak_f32 = 0, peak_bf16 = 0;
  if (!cublas.ok()) {
    std::printf("cublas: unavailable (%s)\n", cublas.error.c_str());
  } else {
    std::printf("cublas: %s\n", cublas.library.c_str());
    peak_f32 = gemm_peak(cublas, pool, DType::f32, o.gemm_n, o.warmup, o.reps);
    peak_bf16 = gemm_peak(cublas, pool, DType::bf16, o.gemm_n, o.warmup, o.reps);
  }

  std::printf("%-6s %-8s  %-7s  %-5s %2s %3s %5s %4s  %-6s  %9s  %9s  %8s  %s\n", "backend", "pass", "var", "dtype",
              "B", "H", "S", "D", "causal", "best_ms", "median_ms", "TFLOP/s", "vs_gemm");
  int failures = 0;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (std::int64_t d : {64, 128}) {
      for (std::int64_t s : seqlens) {
        for (bool causal : {false, true}) {
          for (const auto& b : backends) {
            try {
              run_problem(*b, pool, {dtype, d, s, causal}, o, dtype == DType::f32 ? peak_f32 : peak_bf16);
            } catch (const std::exception& e) {
              std::printf("error: %s %s D=%lld S=%lld causal=%d: %s\n", std::string(b->name()).c_str(),
                          std::string(to_string(dtype)).c_str(), static_cast<long long>(d), static_cast<long long>(s),
                          causal ? 1 : 0, e.what());
              ++failures;
              // A launch failure leaves the context unusable: stop rather than report garbage.
              if (cudaGetLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 1;
            }
          }
        }
      }
    }
  }
  if (cublas.ok() && cublas.destroy) (void)cublas.destroy(cublas.handle);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_bench: %s\n", e.what());
    return 1;
  }
}
