// The cuda backend against the float64 reference, on device memory: the
// conformance cases (tests/support/conformance_cases.h) under the same
// same-precision-baseline rule as tests/conformance, bf16/f16, sizes spanning
// several tiles, accumulate_grads and an f32 dq, the public entry points, and
// the selection. Tests that run a kernel skip without a GPU; the selection
// tests run everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/cuda.h"
#include "attend/backends/reference.h"
#include "backends/cuda/device_problem.h"
#include "support/baseline.h"
#include "support/conformance_cases.h"
#include "support/feature_case.h"
#include "support/half_baseline.h"
#include "support/tensors.h"

namespace attend {
namespace {

// An f32 problem on the device against the f64 reference, with the naive f32
// reference as the baseline: the constants of tests/conformance.
void expect_f32_matches_reference(const Backend& cuda, const testing::Problem& p32, bool grads) {
  const auto naive = make_reference_backend({.accumulate_f64 = false});
  const auto oracle = make_reference_backend();
  const testing::PassResults ref = testing::run_backend(*oracle, testing::problem_as_f64(p32), grads);
  const testing::PassResults base = testing::run_backend(*naive, p32, grads);
  const testing::PassResults got = run_cuda(cuda, p32, grads);
  testing::expect_within_baseline("out", got.out, base.out, ref.out, 2, testing::max_abs(ref.out));
  testing::expect_within_baseline("lse", got.lse, base.lse, ref.lse, 2, testing::max_abs(ref.lse));
  if (!grads) return;
  const double g = std::max({testing::max_abs(ref.dq), testing::max_abs(ref.dk), testing::max_abs(ref.dv)});
  testing::expect_within_baseline("dq", got.dq, base.dq, ref.dq, 3, g);
  testing::expect_within_baseline("dk", got.dk, base.dk, ref.dk, 3, g);
  testing::expect_within_baseline("dv", got.dv, base.dv, ref.dv, 3, g);
}

// A bf16/f16 problem under the half-precision baseline (support/half_baseline.h),
// with the forward on each variant: tensor cores (mma) and CUDA cores (simt).
void expect_half_matches_reference(const Backend& cuda, const testing::Problem& half, bool grads) {
  const DType dt = half.spec.dtype;
  const testing::HalfBaseline b = testing::half_baseline(half, testing::problem_as(half, DType::f64), grads);
  for (const char* variant : {"mma", "simt"}) {
    SCOPED_TRACE(std::string("forward variant ") + variant);
    const Support fwd = cuda.check(half.spec, Pass::forward, Target{Device::cuda(0), cuda.find_variant(variant)});
    ASSERT_TRUE(fwd.ok()) << fwd.to_string();
    const testing::PassResults got = run_cuda(cuda, half, grads, 0, {}, variant);
    EXPECT_EQ(got.out.view().dtype, dt);
    EXPECT_EQ(got.lse.view().dtype, DType::f32);
    if (grads) {
      EXPECT_EQ(got.dq.view().dtype, dt);
    }
    testing::expect_half_results(got, b, dt, grads);
  }
}

// --- a. the conformance cases -------------------------------------------------

TEST(Cuda, ConformanceCasesMatchTheReferenceWhereTheCheckAccepts) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto cuda = make_cuda_backend();
  std::set<std::string> forward_ran, backward_ran, forward_declined;
  for (const testing::FeatureCase& fc : testing::conformance_cases()) {
    for (bool offsets : {false, true}) {
      if (offsets && !fc.lens_q.empty()) continue;
      AttentionSpec spec = fc.spec(77);
      if (offsets) spec = testing::with_offsets(spec);
      const testing::Problem p32 = testing::make_problem(spec, 5, fc.lens_q, fc.lens_kv);
      const std::string where = fc.name + (offsets ? " +offsets" : "");
      SCOPED_TRACE(where);
      const Support fwd = cuda->check(p32.spec, Pass::forward, kCuda);
      const Support bwd = cuda->check(p32.spec, Pass::backward, kCuda);
      const std::string verdict = !fwd.ok()  ? "declined: " + fwd.to_string()
                                  : bwd.ok() ? "forward and backward ran"
                                             : "forward ran, backward declined: " + bwd.to_string();
      std::printf("cuda conformance: %-44s %s\n", where.c_str(), verdict.c_str());
      if (!fwd.ok()) {
        forward_declined.insert(where);
        if (p32.spec.has_sink()) {
          EXPECT_TRUE(fwd.failed(ReasonCode::sinks)) << fwd.to_string();
        }
        continue;
      }
      forward_ran.insert(where);
      if (bwd.ok()) backward_ran.insert(where);
      expect_f32_matches_reference(*cuda, p32, bwd.ok());
    }
  }
  std::printf("cuda conformance: forward ran %zu, declined %zu; backward ran %zu\n", forward_ran.size(),
              forward_declined.size(), backward_ran.size());
  for (const char* c : {"plain_37x53", "causal_gqa", "window_softcap", "alibi_bias", "dropout_causal",
                        "varlen_empty_gqa", "bhsd_layout", "mla_192_128"}) {
    const std::string name = c;
    std::vector<std::string> runs{name};
    if (name != "varlen_empty_gqa") runs.push_back(name + " +offsets");
    for (const std::string& r : runs) {
      EXPECT_TRUE(forward_ran.contains(r)) << "forward declined " << r;
      if (name != "mla_192_128") {
        EXPECT_TRUE(backward_ran.contains(r)) << "backward declined " << r;
      }
    }
  }
  EXPECT_FALSE(backward_ran.contains("mla_192_128")) << "backward ran with head_dim_qk 192";
  for (const char* name :
       {"sink_off_by_one_causal", "sink_off_by_one_causal +offsets", "sink_learnable_window_softcap_mqa",
        "sink_learnable_window_softcap_mqa +offsets", "sink_learnable_varlen"}) {
    EXPECT_TRUE(forward_declined.contains(name)) << "a sink case ran: " << name;
  }
}

// --- b. bf16 / f16 ------------------------------------------------------------------

class CudaHalf : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(CudaHalf, ForwardAndGradientsWithinSamePrecisionBaseline) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto& [name, dt] = GetParam();
  const testing::FeatureCase fc = conformance_case(name);
  const testing::Problem half = testing::problem_as(testing::make_problem(fc.spec(77), 21, fc.lens_q, fc.lens_kv), dt);
  const auto cuda = make_cuda_backend();
  const Support fwd = cuda->check(half.spec, Pass::forward, kCuda), bwd = cuda->check(half.spec, Pass::backward, kCuda);
  ASSERT_TRUE(fwd.ok()) << fwd.to_string();
  ASSERT_TRUE(bwd.ok()) << bwd.to_string();
  expect_half_matches_reference(*cuda, half, true);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaHalf,
                         ::testing::Combine(::testing::Values("plain_37x53", "causal_gqa", "window_softcap",
                                                              "varlen_empty_gqa", "dropout_causal"),
                                            ::testing::Values(DType::bf16, DType::f16)),
                         [](const auto& param_info) {
                           return std::get<0>(param_info.param) + "_" +
                                  std::string(to_string(std::get<1>(param_info.param)));
                         });

// --- c. sizes spanning several tiles, both head-dim templates ----------------------

struct LargeCase {
  std::string name;
  AttentionSpec spec;
  std::vector<std::int32_t> lens_q, lens_kv;
  bool grads = true;  // false: forward only (backward declines these head dims)
  std::vector<DType> dtypes{DType::f32};
};

std::ostream& operator<<(std::ostream& os, const LargeCase& c) { return os << c.name; }

AttentionSpec sized(std::int64_t batch, std::int64_t sq, std::int64_t sk, std::int64_t dqk, std::int64_t dv,
                    std::int64_t heads = 2, std::int64_t heads_kv = 2) {
  AttentionSpec s;
  s.batch = batch;
  s.seqlen_q = sq;
  s.seqlen_kv = sk;
  s.heads_q = heads;
  s.heads_kv = heads_kv;
  s.head_dim_qk = dqk;
  s.head_dim_v = dv;
  return s;
}

LargeCase large(std::string name, AttentionSpec spec) {
  LargeCase c;
  c.name = std::move(name);
  c.spec = spec;
  return c;
}

std::vector<LargeCase> large_cases() {
  std::vector<LargeCase> v;
  LargeCase c = large("causal_gqa_300_d128", sized(2, 300, 300, 128, 128, 4, 2));
  c.spec.causal = true;
  c.dtypes = {DType::f32, DType::bf16};
  v.push_back(c);
  c = large("window_200x333_d64", sized(2, 200, 333, 64, 64));
  c.spec.window_left = 70;
  c.spec.window_right = 30;
  c.dtypes = {DType::f32, DType::f16};
  v.push_back(c);
  // The first 130 rows see no key: whole empty query tiles.
  c = large("causal_sq_above_sk_200x70_d64", sized(1, 200, 70, 64, 64));
  c.spec.causal = true;
  v.push_back(c);
  c = large("varlen_mqa_causal_d64", sized(1, 0, 0, 64, 64, 4, 1));
  c.lens_q = {130, 0, 77, 200};
  c.lens_kv = {150, 64, 1, 200};
  c.spec.layout = Layout::thd;
  c.spec.causal = true;
  v.push_back(c);
  c = large("d256_150x170", sized(2, 150, 170, 256, 256));
  c.grads = false;
  c.dtypes = {DType::f32, DType::bf16};
  v.push_back(c);
  c = large("mla_192_128_130x260_causal", sized(1, 130, 260, 192, 128, 4, 2));
  c.spec.causal = true;
  c.grads = false;
  v.push_back(c);
  return v;
}

class CudaLarge : public ::testing::TestWithParam<LargeCase> {};

TEST_P(CudaLarge, MatchesTheReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const LargeCase& c = GetParam();
  const auto cuda = make_cuda_backend();
  const testing::Problem p32 = testing::make_problem(c.spec, 41, c.lens_q, c.lens_kv);
  const Support fwd = cuda->check(p32.spec, Pass::forward, kCuda), bwd = cuda->check(p32.spec, Pass::backward, kCuda);
  ASSERT_TRUE(fwd.ok()) << fwd.to_string();
  if (c.grads) {
    ASSERT_TRUE(bwd.ok()) << bwd.to_string();
  } else {
    EXPECT_TRUE(bwd.failed(ReasonCode::head_dim_qk)) << bwd.to_string();
  }
  for (DType dt : c.dtypes) {
    SCOPED_TRACE(std::string(to_string(dt)));
    if (dt == DType::f32) {
      expect_f32_matches_reference(*cuda, p32, c.grads);
    } else {
      expect_half_matches_reference(*cuda, testing::problem_as(p32, dt), c.grads);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaLarge, ::testing::ValuesIn(large_cases()),
                         [](const auto& param_info) { return param_info.param.name; });

// --- d. accumulate_grads and an f32 dq ----------------------------------------------

void expect_plus_one(const char* what, const Tensor& got, const Tensor& plain) {
  ASSERT_EQ(got.numel(), plain.numel());
  double worst = 0;
  std::int64_t at = -1;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double want = testing::element(plain, i) + 1;
    const double err = std::abs(testing::element(got, i) - want) / std::max(1.0, std::abs(want));
    if (!(err <= worst)) {  // also catches NaN
      worst = std::isnan(err) ? INFINITY : err;
      at = i;
    }
  }
  EXPECT_LE(worst, 1e-5) << what << ": relative error " << worst << " at element " << at;
}

TEST(Cuda, AccumulateGradsAddsIntoTheGivenGradients) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto cuda = make_cuda_backend();
  std::vector<testing::Problem> problems;
  for (const char* name : {"causal_gqa", "varlen_empty_gqa"}) {
    const testing::FeatureCase fc = conformance_case(name);
    problems.push_back(testing::make_problem(fc.spec(77), 51, fc.lens_q, fc.lens_kv));
  }
  AttentionSpec big = sized(2, 300, 300, 128, 128, 4, 2);
  big.causal = true;
  problems.push_back(testing::make_problem(big, 52));
  for (const testing::Problem& p : problems) {
    SCOPED_TRACE(describe(p.spec));
    testing::Problem acc = p;
    acc.spec.accumulate_grads = true;
    const Support bwd = cuda->check(acc.spec, Pass::backward, kCuda);
    ASSERT_TRUE(bwd.ok()) << bwd.to_string();
    const testing::PassResults plain = run_cuda(*cuda, p, true);
    const testing::PassResults got = run_cuda(*cuda, acc, true, 1.0);
    expect_plus_one("dq", got.dq, plain.dq);
    expect_plus_one("dk", got.dk, plain.dk);
    expect_plus_one("dv", got.dv, plain.dv);
  }
}

// Without accumulate_grads every gradient element is written, also for keys
// no query sees and rows that see no key: NaN-filled buffers come back equal
// to the zero-filled run (sk <= 64 is one key block, so dq's atomics add one
// term per element and both runs are bit for bit equal).
TEST(Cuda, GradientsAreWrittenWhole) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto cuda = make_cuda_backend();
  for (const char* name : {"causal_sq_below_sk_mqa", "varlen_empty_gqa", "window_softcap"}) {
    SCOPED_TRACE(name);
    const testing::FeatureCase fc = conformance_case(name);
    const testing::Problem p = testing::make_problem(fc.spec(77), 91, fc.lens_q, fc.lens_kv);
    const Support bwd = cuda->check(p.spec, Pass::backward, kCuda);
    ASSERT_TRUE(bwd.ok()) << bwd.to_string();
    const testing::PassResults zero = run_cuda(*cuda, p, true);
    const testing::PassResults nan = run_cuda(*cuda, p, true, std::nan(""));
    EXPECT_TRUE(testing::bitwise_equal(nan.dq, zero.dq));
    EXPECT_TRUE(testing::bitwise_equal(nan.dk, zero.dk));
    EXPECT_TRUE(testing::bitwise_equal(nan.dv, zero.dv));
  }
}

TEST(Cuda, F32DqOnBf16MatchesTheReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto cuda = make_cuda_backend();
  for (const char* name : {"causal_gqa", "varlen_empty_gqa", "dropout_causal"}) {
    SCOPED_TRACE(name);
    const testing::FeatureCase fc = conformance_case(name);
    const testing::Problem half =
        testing::problem_as(testing::make_problem(fc.spec(77), 61, fc.lens_q, fc.lens_kv), DType::bf16);
    testing::Problem wide = half;
    wide.spec.dq_dtype = DType::f32;
    const Support bwd = cuda->check(wide.spec, Pass::backward, kCuda);
    ASSERT_TRUE(bwd.ok()) << bwd.to_string();
    const testing::PassResults got = run_cuda(*cuda, wide, true);
    ASSERT_EQ(got.dq.view().dtype, DType::f32);
    EXPECT_EQ(got.dk.view().dtype, DType::bf16);
    EXPECT_EQ(got.dv.view().dtype, DType::bf16);
    // The baseline of the default (bf16 dq) problem: the f32 dq must be as close.
    const testing::HalfBaseline b = testing::half_baseline(half, testing::problem_as(half, DType::f64), true);
    const Tensor* largest = &b.ref.dq;
    for (const Tensor* t : {&b.ref.dk, &b.ref.dv}) {
      if (testing::max_abs(*t) > testing::max_abs(*largest)) largest = t;
    }
    testing::expect_half_within("dq (f32)", got.dq, b.naive.dq, b.ref.dq, 3, DType::bf16, largest);
    testing::expect_half_within("dk", got.dk, b.naive.dk, b.ref.dk, 3, DType::bf16, largest);
    testing::expect_half_within("dv", got.dv, b.naive.dv, b.ref.dv, 3, DType::bf16, largest);
    EXPECT_FALSE(testing::bitwise_equal(testing::convert(testing::convert(got.dq, DType::bf16), DType::f32), got.dq))
        << "the f32 dq holds no more than bf16";
  }
}

// --- e. the public entry points ----------------------------------------------------------

// sq and sk below one 64-row/64-key tile and no GQA: every dq and dk/dv element
// gets one contribution, so the atomics leave both runs bit for bit equal.
TEST(Cuda, PublicEntryPointsSelectCudaAndMatchTheDirectCall) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto cuda = make_cuda_backend();
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(to_string(dt)));
    AttentionSpec s = sized(2, 37, 29, 32, 32);
    s.window_left = 20;
    testing::Problem p = testing::make_problem(s, 71);
    if (dt != DType::f32) p = testing::problem_as(p, dt);
    // Training needs both passes on one variant: simt (mma has no backward).
    const testing::PassResults direct = run_cuda(*cuda, p, true, 0, {}, "simt");

    DeviceArena mem;
    const DeviceProblem d = upload(mem, p);
    CallOptions options;
    options.allocator = &cuda_allocator();
    if (dt != DType::f32) {
      // Inference of a half dtype takes the tensor-core forward.
      const ForwardResult inf = attend::forward(d.in, p.spec, Mode::inference, options);
      EXPECT_EQ(inf.ctx.selection().variant_name(), "mma");
      const testing::PassResults mma = run_cuda(*cuda, p, false, 0, {}, "mma");
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(testing::bitwise_equal(download(inf.out), mma.out));
      EXPECT_TRUE(testing::bitwise_equal(download(inf.lse), mma.lse));
    }
    const ForwardResult fr = attend::forward(d.in, p.spec, Mode::training, options);
    EXPECT_EQ(fr.ctx.backend().name(), "cuda");
    EXPECT_EQ(fr.ctx.selection().variant_name(), "simt");
    EXPECT_TRUE(fr.out.view().device == Device::cuda(0));
    const Gradients g = attend::backward(fr.ctx, d.dout, options);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(testing::bitwise_equal(download(fr.out), direct.out));
    EXPECT_TRUE(testing::bitwise_equal(download(fr.lse), direct.lse));
    EXPECT_TRUE(testing::bitwise_equal(download(g.dq), direct.dq));
    EXPECT_TRUE(testing::bitwise_equal(download(g.dk), direct.dk));
    EXPECT_TRUE(testing::bitwise_equal(download(g.dv), direct.dv));
  }
}

TEST(Cuda, ForwardOnAStreamEqualsTheDefaultStream) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto cuda = make_cuda_backend();
  AttentionSpec s = sized(2, 150, 170, 64, 64, 4, 2);
  s.causal = true;
  const testing::Problem p = testing::make_problem(s, 81);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  testing::PassResults on_stream, on_default;
  try {
    on_stream = run_cuda(*cuda, p, false, 0, Stream{stream});
    on_default = run_cuda(*cuda, p, false);
  } catch (...) {
    (void)cudaStreamDestroy(stream);
    throw;
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_TRUE(testing::bitwise_equal(on_stream.out, on_default.out));
  EXPECT_TRUE(testing::bitwise_equal(on_stream.lse, on_default.lse));
}

// --- f. selection (no GPU needed) ------------------------------------------------------

AttentionSpec mla_training_spec() {
  AttentionSpec s = sized(2, 1024, 1024, 192, 128, 16, 16);
  s.causal = true;
  return s;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

TEST(CudaSelection, IsRegisteredAndServesDeviceMemoryOnly) {
  const auto cuda = Registry::global().find("cuda");
  ASSERT_NE(cuda, nullptr);
  EXPECT_TRUE(cuda->serves(DeviceKind::cuda));
  EXPECT_FALSE(cuda->serves(DeviceKind::cpu));
  EXPECT_GE(cuda_device_count(), 0);
}

TEST(CudaSelection, HostTensorsAreDeclinedForTheirDevice) {
  const auto cuda = make_cuda_backend();
  const AttentionSpec s = sized(1, 64, 64, 64, 64);
  for (Pass pass : {Pass::forward, Pass::backward}) {
    for (int variant : {-1, 0, 1}) {
      const Support sup = cuda->check(s, pass, Target{Device::cpu(), variant});
      EXPECT_FALSE(sup.ok());
      EXPECT_TRUE(sup.failed(ReasonCode::device)) << sup.to_string();
    }
  }
}

TEST(CudaSelection, TrainingWithHeadDims192And128IsDeclinedForTheBackward) {
  const AttentionSpec s = mla_training_spec();
  const auto cuda = Registry::global().find("cuda");
  ASSERT_NE(cuda, nullptr);
  // Without cudnn (which trains 192/128 on Hopper), cuda is the only backend
  // serving device memory and cannot train this problem.
  Policy policy = current_policy();
  policy.disabled.push_back("cudnn");
  try {
    const Selection sel = select(s, Mode::training, policy, Device::cuda(0));
    ADD_FAILURE() << "selected " << sel.backend->name();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
  const Selection sel = evaluate(s, Mode::training, policy, Device::cuda(0));
  EXPECT_EQ(sel.backend, nullptr);
  const Verdict* v = nullptr;
  for (const Verdict& x : sel.verdicts) {
    if (x.backend == "cuda" && x.variant == "simt") v = &x;  // mma has no backward at all
  }
  ASSERT_NE(v, nullptr) << sel.explain();
  ASSERT_TRUE(v->backward.has_value());
  EXPECT_FALSE(v->viable);
  if (cuda_device_count() == 0) {
    // The variants stay listed (asking the driver at registration would
    // initialise CUDA in every process); the check names the missing device.
    EXPECT_TRUE(v->variant_excluded.empty()) << sel.explain();
    EXPECT_TRUE(v->backward->failed(ReasonCode::device)) << v->backward->to_string();
    const Support sup = cuda->check(s, Pass::backward, Target{Device::cuda(0)});
    EXPECT_TRUE(sup.failed(ReasonCode::device)) << sup.to_string();
    const std::string text = lower(sup.to_string());
    EXPECT_TRUE(text.find("gpu") != std::string::npos || text.find("device") != std::string::npos ||
                text.find("driver") != std::string::npos)
        << "the reason does not name the missing device: " << sup.to_string();
  } else {
    EXPECT_TRUE(v->variant_excluded.empty()) << v->variant_excluded;
    EXPECT_TRUE(v->forward.ok()) << v->forward.to_string();
    EXPECT_TRUE(v->backward->failed(ReasonCode::head_dim_qk)) << v->backward->to_string();
    const Support bwd = cuda->check(s, Pass::backward, Target{Device::cuda(0), cuda->find_variant("simt")});
    EXPECT_TRUE(bwd.failed(ReasonCode::head_dim_qk)) << bwd.to_string();
    EXPECT_NE(bwd.to_string().find("192"), std::string::npos) << bwd.to_string();
    const Support fwd = cuda->check(s, Pass::forward, Target{Device::cuda(0)});
    EXPECT_TRUE(fwd.ok()) << fwd.to_string();
    const Selection inference = select(s, Mode::inference, policy, Device::cuda(0));
    ASSERT_NE(inference.backend, nullptr);
    EXPECT_EQ(inference.backend->name(), "cuda");
  }
}

}  // namespace
}  // namespace attend
