// The host allocator's cache of large blocks: a freed block of 1 MiB or more
// comes back for the next request of its rounded size (so repeated calls do
// not page-fault fresh memory), small blocks are never cached, release()
// returns everything, and concurrent use keeps every block's contents intact.
// Blocks and Tensor::zeros storage of 2 MiB and more sit on 2 MiB boundaries
// (huge pages, host_memory.h) unless ATTEND_HUGE_PAGES=0.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "attend/attend.h"
#include "runtime/host_memory.h"

namespace attend {
namespace {

class HostAllocatorCache : public ::testing::Test {
 protected:
  void SetUp() override { host_cache_release(); }
  void TearDown() override { host_cache_release(); }
};

// The class of a cached request: 64 KiB steps, whole huge pages from 2 MiB.
std::size_t class_of(std::size_t bytes) {
  const std::size_t g =
      bytes >= detail::kHugePageBytes && detail::huge_pages_advised() ? detail::kHugePageBytes : std::size_t{1} << 16;
  return (bytes + g - 1) / g * g;
}

TEST_F(HostAllocatorCache, AFreedLargeBlockServesTheNextRequestOfItsRoundedSize) {
  Allocator& a = host_allocator();
  for (const std::size_t bytes : {std::size_t{3} << 19, std::size_t{4} << 20}) {  // 1.5 MiB, 4 MiB
    void* p = a.allocate(bytes, Device::cpu());
    std::memset(p, 1, bytes);
    EXPECT_EQ(host_cache_bytes(), 0u);
    a.deallocate(p, bytes, Device::cpu());
    EXPECT_EQ(host_cache_bytes(), bytes);              // a multiple of both granules
    void* q = a.allocate(bytes - 100, Device::cpu());  // the same class
    EXPECT_EQ(q, p);
    EXPECT_EQ(host_cache_bytes(), 0u);
    const std::size_t larger = class_of(bytes) + 1;  // the next class: a new block
    void* r = a.allocate(larger, Device::cpu());
    EXPECT_NE(r, p);
    a.deallocate(q, bytes - 100, Device::cpu());
    a.deallocate(r, larger, Device::cpu());
    EXPECT_EQ(host_cache_bytes(), bytes + class_of(larger)) << bytes;
    host_cache_release();
    EXPECT_EQ(host_cache_bytes(), 0u);
  }
}

TEST_F(HostAllocatorCache, SmallBlocksAreNeverCached) {
  Allocator& a = host_allocator();
  void* p = a.allocate(4096, Device::cpu());
  a.deallocate(p, 4096, Device::cpu());
  void* q = a.allocate((1 << 20) - 1, Device::cpu());
  a.deallocate(q, (1 << 20) - 1, Device::cpu());
  EXPECT_EQ(host_cache_bytes(), 0u);
}

TEST_F(HostAllocatorCache, LargeBlocksAndTensorsSitOnHugePageBoundaries) {
  if (!detail::huge_pages_advised()) GTEST_SKIP() << "ATTEND_HUGE_PAGES=0";
  constexpr std::size_t kHuge = detail::kHugePageBytes;
  Allocator& a = host_allocator();
  for (const std::size_t bytes : {kHuge, kHuge + 1, (std::size_t{5} << 20) + 3}) {
    void* p = a.allocate(bytes, Device::cpu());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % kHuge, 0u) << bytes;
    std::memset(p, 7, bytes);  // the whole block is usable
    a.deallocate(p, bytes, Device::cpu());
  }
  // Tensor::zeros: huge-page storage, zeroed (3 MiB of f32 plus a partial page).
  const Tensor t = Tensor::zeros(DType::f32, {3, 262144 + 5});
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % kHuge, 0u);
  const float* x = t.as<float>();
  std::int64_t nonzero = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) nonzero += x[i] != 0.0f;
  EXPECT_EQ(nonzero, 0);
}

TEST_F(HostAllocatorCache, EveryBlockIsSixtyFourByteAligned) {
  Allocator& a = host_allocator();
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{100}, std::size_t{1} << 20, (std::size_t{5} << 20) + 3}) {
    void* p = a.allocate(bytes, Device::cpu());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << bytes;
    a.deallocate(p, bytes, Device::cpu());
  }
}

TEST_F(HostAllocatorCache, OtherDevicesAreAnError) {
  try {
    (void)host_allocator().allocate(1 << 20, Device::cuda(0));
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "device");
  }
}

// The public path in steady state: the second call's outputs reuse the
// blocks the first call's freed outputs left in the cache.
TEST_F(HostAllocatorCache, RepeatedForwardReusesItsOutputBlocks) {
  AttentionSpec s;
  s.batch = 1;
  s.heads_q = s.heads_kv = 8;
  s.head_dim_qk = s.head_dim_v = 64;
  s.seqlen_q = s.seqlen_kv = 1024;  // out: 2 MiB
  const Tensor q = Tensor::zeros(DType::f32, {1, 1024, 8, 64}), k = Tensor::zeros_like(q), v = Tensor::zeros_like(q);
  const void* first = nullptr;
  {
    const ForwardResult r = forward(q, k, v, s, Mode::inference);
    first = r.out.data();
  }
  EXPECT_GE(host_cache_bytes(), std::size_t{2} << 20);
  const ForwardResult r = forward(q, k, v, s, Mode::inference);
  EXPECT_EQ(r.out.data(), first);
}

TEST_F(HostAllocatorCache, ConcurrentUseKeepsEveryBlockIntact) {
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &bad] {
      Allocator& a = host_allocator();
      for (int i = 0; i < 200; ++i) {
        const std::size_t bytes = (std::size_t{1} << 20) + static_cast<std::size_t>((i % 3) << 16);
        auto* p = static_cast<unsigned char*>(a.allocate(bytes, Device::cpu()));
        const auto mark = static_cast<unsigned char>(t * 50 + i % 50);
        std::memset(p, mark, bytes);
        std::this_thread::yield();
        bad[static_cast<std::size_t>(t)] += p[0] != mark || p[bytes / 2] != mark || p[bytes - 1] != mark;
        a.deallocate(p, bytes, Device::cpu());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[static_cast<std::size_t>(t)], 0) << "thread " << t;
  // At most as many blocks of a size as were ever live at once: 4 per size class.
  EXPECT_LE(host_cache_bytes(), std::size_t{4} * ((std::size_t{3} << 20) + (std::size_t{3} << 16)));
}

}  // namespace
}  // namespace attend
