// memory_stats() counts tensor storage exactly, with a resettable peak.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fsdpp/memory.h>

namespace fsdpp {
namespace {

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

}  // namespace
}  // namespace fsdpp
