// Resource limits: the reference's score-memory budget and allocation failure.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "support/tensors.h"

namespace attend {
namespace {

// ASan's and TSan's operator new report a failed allocation and exit instead of
// throwing std::bad_alloc, so the out_of_memory path cannot be reached there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizedNew = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizedNew = true;
#else
constexpr bool kSanitizedNew = false;
#endif
#else
constexpr bool kSanitizedNew = false;
#endif

// Restores the built-in registry (and the env var) whatever the test did.
struct BudgetEnv {
  explicit BudgetEnv(const char* bytes) {
    ::setenv("ATTEND_REFERENCE_MAX_BYTES", bytes, 1);
    Registry::global().reset_to_builtins();
  }
  ~BudgetEnv() {
    ::unsetenv("ATTEND_REFERENCE_MAX_BYTES");
    Registry::global().reset_to_builtins();
  }
};

AttentionSpec bias_grad_spec(std::int64_t seqlen) {
  AttentionSpec s;
  s.seqlen_q = s.seqlen_kv = seqlen;
  s.head_dim_qk = s.head_dim_v = 8;
  s.has_bias = s.bias_requires_grad = true;  // only the reference computes dbias
  return s;
}

TEST(ResourceLimits, ReferenceBudgetFromEnvDeclinesWithReasonAndByteCount) {
  const BudgetEnv env("1000");
  const Support sup = Registry::global().find("reference")->check(bias_grad_spec(64), Pass::forward);
  ASSERT_FALSE(sup.ok());
  EXPECT_EQ(sup.reasons[0].code, ReasonCode::memory);
  // 64x64 doubles = 32768 bytes, rounded to the 64-byte alignment.
  EXPECT_NE(sup.reasons[0].message.find("32768 bytes"), std::string::npos) << sup.reasons[0].message;
  EXPECT_NE(sup.reasons[0].message.find("max_score_bytes 1000"), std::string::npos) << sup.reasons[0].message;
}

TEST(ResourceLimits, SelectorMovesOnWhenReferenceExceedsItsBudget) {
  const BudgetEnv env("1000");
  AttentionSpec s;
  s.seqlen_q = s.seqlen_kv = 64;
  s.head_dim_qk = s.head_dim_v = 8;
  Policy p;
  p.disabled = {};
  const Selection sel = select(s, Mode::training, p);
  EXPECT_NE(sel.backend->name(), "reference");
  const Verdict& ref = sel.verdicts.back();
  ASSERT_EQ(ref.backend, "reference");
  EXPECT_FALSE(ref.viable);
}

TEST(ResourceLimits, NoBackendLeftErrorNamesTheByteCount) {
  const BudgetEnv env("1000");
  try {
    (void)select(bias_grad_spec(64), Mode::training, Policy{});
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("32768 bytes"), std::string::npos) << e.what();
  }
}

TEST(ResourceLimits, MalformedBudgetIsAnErrorNamingTheVariable) {
  ::setenv("ATTEND_REFERENCE_MAX_BYTES", "12GB", 1);
  try {
    Registry::global().reset_to_builtins();
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "ATTEND_REFERENCE_MAX_BYTES");
  }
  ::unsetenv("ATTEND_REFERENCE_MAX_BYTES");
  Registry::global().reset_to_builtins();
}

TEST(ResourceLimits, HugeTensorAllocationIsAnOutOfMemoryError) {
  if (kSanitizedNew) GTEST_SKIP() << "sanitizer operator new does not throw";
  // 2^60 floats: representable in size_t, never allocatable.
  try {
    (void)Tensor::zeros(DType::f32, {std::int64_t{1} << 30, std::int64_t{1} << 30});
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
  }
}

TEST(ResourceLimits, WorkspaceAllocationFailureIsAnOutOfMemoryError) {
  if (kSanitizedNew) GTEST_SKIP() << "sanitizer operator new does not throw";
  // A stride-0 K/V view makes 2^50 keys out of one float; the reference with
  // an unlimited budget then needs an 8 PiB score row.
  const auto backend = make_reference_backend(ReferenceOptions{true, ~std::size_t{0}});
  AttentionSpec s;
  s.seqlen_q = 1;
  s.seqlen_kv = std::int64_t{1} << 50;
  s.head_dim_qk = s.head_dim_v = 1;
  float one[4] = {1, 1, 1, 1};
  const TensorView q = TensorView::contiguous(one, DType::f32, {1, 1, 1, 1});
  const TensorView out = TensorView::contiguous(one + 1, DType::f32, {1, 1, 1, 1});
  const TensorView lse = TensorView::contiguous(one + 2, DType::f32, {1, 1, 1});
  TensorView kv = q;
  kv.shape = {1, s.seqlen_kv, 1, 1};
  kv.strides = {0, 0, 0, 1};
  Inputs in;
  in.q = q;
  in.k = in.v = kv;
  try {
    backend->forward(ForwardArgs{s, in, out, lse});
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_memory) << e.what();
  }
}

}  // namespace
}  // namespace attend
