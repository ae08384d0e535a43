// What the hot path allocates: a passing check builds no text, and making a
// plan whose selection is cached — including a decode step whose key count
// grew within its power-of-two bucket — allocates nothing at all. Counted by
// replacing the global operator new in this test binary only.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "attend/attend.h"
#include "attend/backends/decode.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"

// Sanitizer runtimes own operator new/delete (and report a replaced pair as an
// allocation mismatch): there the counting is off and the tests skip.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ATTEND_COUNTS_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define ATTEND_COUNTS_ALLOCATIONS 0
#endif
#endif
#ifndef ATTEND_COUNTS_ALLOCATIONS
#define ATTEND_COUNTS_ALLOCATIONS 1
#endif

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

#if ATTEND_COUNTS_ALLOCATIONS
void* operator new(std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace attend {
namespace {

AttentionSpec decode_step(std::int64_t keys) {
  AttentionSpec s;
  s.batch = 1;
  s.seqlen_q = 1;
  s.seqlen_kv = keys;
  s.heads_q = 8;
  s.heads_kv = 2;
  s.head_dim_qk = s.head_dim_v = 64;
  s.causal = true;
  return s;
}

template <class Fn>
long allocations(Fn&& fn) {
  const long before = g_allocations.load();
  fn();
  return g_allocations.load() - before;
}

TEST(Allocations, APassingCheckBuildsNoText) {
  if (!ATTEND_COUNTS_ALLOCATIONS) GTEST_SKIP() << "a sanitizer owns operator new here";
  const AttentionSpec s = decode_step(100);
  for (const auto& b : {make_flash_backend(), make_decode_backend(), make_reference_backend()}) {
    const Target t{Device::cpu(), b->default_variant()};
    Support sup;
    EXPECT_EQ(allocations([&] { sup = b->check(s, Pass::forward, t, Support::Detail::full); }), 0) << b->name();
    EXPECT_TRUE(sup.ok()) << b->name();
  }
  // A declining check in Detail::codes records the code, still without text.
  Support no;
  const auto decode = make_decode_backend();
  EXPECT_EQ(allocations([&] { no = decode->check(s, Pass::backward, {}, Support::Detail::codes); }), 0);
  EXPECT_TRUE(no.failed(ReasonCode::no_backward));
  EXPECT_TRUE(no.reasons.empty());
}

TEST(Allocations, PlansOfAGrowingDecodeCacheAllocateNothingOnceCached) {
  if (!ATTEND_COUNTS_ALLOCATIONS) GTEST_SKIP() << "a sanitizer owns operator new here";
  (void)Plan::make(decode_step(65), Mode::inference);  // the bucket's first problem: selects
  for (std::int64_t keys = 66; keys <= 128; ++keys) {
    Plan p;
    EXPECT_EQ(allocations([&] { p = Plan::make(decode_step(keys), Mode::inference); }), 0) << keys;
    EXPECT_EQ(p.backend().name(), "decode");
  }
}

}  // namespace
}  // namespace attend
