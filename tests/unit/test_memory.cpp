// memory_stats() counts tensor storage exactly, with a resettable peak; freed blocks are
// cached for reuse, within a bound.
#include <gtest/gtest.h>

#include <cstdlib>

#include <ATen/ATen.h>

#include <fsdpp/memory.h>

#include "harness/error_of.h"
#include "memory/allocator_caching.h"
#include "memory/block_cache.h"

namespace fsdpp {
namespace {

using testing::error_of;

TEST(MemoryStats, CountsLiveAndPeakTensorBytes) {
  const MemoryStats before = memory_stats();
  int64_t peak_seen = 0;
  {
    at::Tensor a = at::empty({1024}, at::kFloat);  // 4 KiB
    EXPECT_EQ(memory_stats().current_bytes - before.current_bytes, 4096);
    {
      at::Tensor b = at::empty({256, 256}, at::kDouble);  // 512 KiB
      EXPECT_EQ(memory_stats().current_bytes - before.current_bytes, 4096 + 524288);
      peak_seen = memory_stats().peak_bytes;
      EXPECT_GE(peak_seen, before.current_bytes + 4096 + 524288);
    }
    EXPECT_EQ(memory_stats().current_bytes - before.current_bytes, 4096);
    EXPECT_EQ(memory_stats().peak_bytes, peak_seen);  // the peak stays until reset
    reset_peak_memory_stats();
    EXPECT_EQ(memory_stats().peak_bytes, memory_stats().current_bytes);
  }
  EXPECT_EQ(memory_stats().current_bytes, before.current_bytes);
  EXPECT_GT(memory_stats().num_allocations, before.num_allocations);
}

TEST(MemoryStats, ViewsAndResultsOfOpsAreCountedOnce) {
  at::Tensor a = at::ones({100, 100});
  const int64_t base = memory_stats().current_bytes;
  at::Tensor view = a.narrow(0, 0, 10);  // no new storage
  EXPECT_EQ(memory_stats().current_bytes, base);
  at::Tensor sum = a + a;  // one new 40000-byte storage
  EXPECT_EQ(memory_stats().current_bytes, base + 40000);
}

TEST(MemoryStats, FreedBlocksAreReusedBySameSize) {
  empty_cache();
  const int64_t base = memory_stats().current_bytes;
  at::Tensor big = at::empty({1 << 18}, at::kFloat);  // 1 MiB
  void* first = big.data_ptr();
  big = at::Tensor();
  EXPECT_EQ(memory_stats().current_bytes, base);  // live bytes only
  EXPECT_GE(memory_stats().cached_bytes, 1 << 20);
  at::Tensor again = at::empty({1 << 18}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(memory_stats().cached_bytes, 0);
  EXPECT_EQ(memory_stats().current_bytes, base + (1 << 20));
  again = at::Tensor();
  at::Tensor other = at::empty({(1 << 18) + 1}, at::kFloat);  // another size: not that block
  EXPECT_NE(other.data_ptr(), first);
  EXPECT_EQ(memory_stats().cached_bytes, 1 << 20);
  empty_cache();
}

TEST(MemoryStats, BlocksFreedInANoCachingScopeGoBackToTheSystem) {
  empty_cache();
  at::Tensor big = at::empty({1 << 18}, at::kFloat);
  {
    detail::NoCachingScope no_caching;
    big = at::Tensor();
  }
  EXPECT_EQ(memory_stats().cached_bytes, 0);
  big = at::empty({1 << 18}, at::kFloat);
  big = at::Tensor();
  EXPECT_EQ(memory_stats().cached_bytes, 1 << 20);
  empty_cache();
}

TEST(MemoryStats, SmallBlocksAreNotCached) {
  empty_cache();
  at::Tensor small = at::empty({1024}, at::kFloat);
  small = at::Tensor();
  EXPECT_EQ(memory_stats().cached_bytes, 0);
}

TEST(MemoryStats, EmptyCacheAndDisablingReturnTheBlocks) {
  at::Tensor big = at::empty({1 << 18}, at::kFloat);
  big = at::Tensor();
  EXPECT_GT(memory_stats().cached_bytes, 0);
  empty_cache();
  EXPECT_EQ(memory_stats().cached_bytes, 0);
  set_allocator_caching(false);
  big = at::empty({1 << 18}, at::kFloat);
  big = at::Tensor();
  EXPECT_EQ(memory_stats().cached_bytes, 0);
  set_allocator_caching(true);
  big = at::empty({1 << 18}, at::kFloat);
  big = at::Tensor();
  EXPECT_GT(memory_stats().cached_bytes, 0);
  empty_cache();
}

// set_memory_limit behaves like a GPU's memory: an allocation past it throws
// c10::OutOfMemoryError naming the bytes asked for, in use and the limit; cached blocks count
// against the limit and are given back first; the process carries on.
TEST(MemoryLimit, AllocationPastTheLimitThrowsNamingTheBytes) {
  struct NoLimitAfter {
    ~NoLimitAfter() { set_memory_limit(0); }
  } no_limit_after;
  empty_cache();
  const int64_t base = memory_stats().current_bytes;
  const int64_t limit = base + (1 << 20);
  set_memory_limit(limit);
  EXPECT_EQ(memory_limit(), limit);
  at::Tensor a = at::empty({1 << 17}, at::kFloat);  // 512 KiB: fits
  try {
    at::Tensor too_big = at::empty({1 << 18}, at::kFloat);  // 1 MiB more: does not
    FAIL() << "allocated past the limit";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tried to allocate 1.00 MiB (1048576 bytes)"), std::string::npos) << what;
    EXPECT_NE(what.find("with " + std::to_string(base + (1 << 19)) + " bytes in use"), std::string::npos) << what;
    EXPECT_NE(what.find("a limit of " + std::to_string(limit) + " bytes"), std::string::npos) << what;
  }
  EXPECT_EQ(memory_stats().current_bytes, base + (1 << 19));
  a = at::Tensor();  // cached: live + cached + asked would pass the limit, so the cache goes
  EXPECT_GE(memory_stats().cached_bytes, 1 << 19);
  at::Tensor b = at::empty({(1 << 17) + (1 << 16)}, at::kFloat);  // 768 KiB, another size
  EXPECT_EQ(memory_stats().cached_bytes, 0);
  EXPECT_NE(error_of([] { set_memory_limit(-1); }).find("set_memory_limit: -1 bytes"), std::string::npos);
  set_memory_limit(0);
  at::Tensor c = at::empty({1 << 18}, at::kFloat);  // no limit
  EXPECT_EQ(memory_stats().current_bytes, base + (3 << 18) + (1 << 20));  // b and c
}

// The cache's own bookkeeping: exact sizes, the bound, oldest blocks evicted first.
TEST(CPUBlockCache, KeepsWithinTheLimitEvictingTheOldest) {
  constexpr size_t kBlock = detail::CPUBlockCache::kMinBytes;
  detail::CPUBlockCache cache;
  void* a = std::malloc(kBlock);
  void* b = std::malloc(kBlock);
  void* c = std::malloc(2 * kBlock);
  const int64_t limit = 3 * kBlock;
  ASSERT_TRUE(cache.keep(a, kBlock, limit));
  ASSERT_TRUE(cache.keep(b, kBlock, limit));
  EXPECT_EQ(cache.cached_bytes(), 2 * static_cast<int64_t>(kBlock));
  ASSERT_TRUE(cache.keep(c, 2 * kBlock, limit));  // a (the oldest) is freed to make room
  EXPECT_EQ(cache.cached_bytes(), 3 * static_cast<int64_t>(kBlock));
  EXPECT_EQ(cache.take(kBlock), b);
  EXPECT_EQ(cache.take(kBlock), nullptr);
  EXPECT_EQ(cache.take(2 * kBlock), c);
  EXPECT_FALSE(cache.keep(b, kBlock, kBlock - 1));       // larger than the limit
  EXPECT_FALSE(cache.keep(c, kBlock / 2, limit));        // below the cached size
  EXPECT_EQ(cache.cached_bytes(), 0);
  std::free(b);
  std::free(c);
}

}  // namespace
}  // namespace fsdpp
