// The wire-byte models behind CommDebugMode.
#include <gtest/gtest.h>

#include "comm/wire_bytes.h"

namespace fsdpp::detail {
namespace {

TEST(WireBytes, RingAllReduceOfOneRankSendsNothing) { EXPECT_EQ(ring_all_reduce_bytes(4096, 4, 0, 1), 0); }

TEST(WireBytes, TreeBroadcastRootSendsLogNTimes) {
  EXPECT_EQ(tree_broadcast_sends(0, 0, 1), 0);
  EXPECT_EQ(tree_broadcast_sends(0, 0, 2), 1);
  EXPECT_EQ(tree_broadcast_sends(1, 0, 2), 0);
  EXPECT_EQ(tree_broadcast_sends(0, 0, 4), 2);
  EXPECT_EQ(tree_broadcast_sends(1, 0, 4), 1);  // low bit first: 0->1, then 0->2 and 1->3
  EXPECT_EQ(tree_broadcast_sends(2, 0, 4), 0);
  EXPECT_EQ(tree_broadcast_sends(1, 1, 3), 2);  // root 1 of 3: sends to 2, then 0
}

}  // namespace
}  // namespace fsdpp::detail

namespace fsdpp::detail {
namespace {

TEST(WireBytes, RingAllReduceSendsTwiceNMinusOneOverNOfTheBuffer) {
  for (int n : {2, 3, 4})
    for (int rank = 0; rank < n; ++rank) {
      const int64_t bytes = int64_t{64} << 20;  // divisible into equal segments for n = 2, 4
      if (64 % n == 0) {
        EXPECT_EQ(ring_all_reduce_bytes(bytes, 4, rank, n), 2 * (n - 1) * bytes / n) << n;
      }
      // Uneven sizes: never more than the ideal rounded up to whole segments.
      const int64_t odd = 4 * 1000003;
      EXPECT_LE(ring_all_reduce_bytes(odd, 4, rank, n), 2 * (n - 1) * odd / n + 2 * n * (1 << 20)) << n;
    }
}

// fsdpp-plan's all-reduce figure is the ranks' mean of what each sends: every segment goes
// n - 1 times in each phase, so the ranks together send 2 (n - 1) times the buffer.
TEST(WireBytes, RingAllReduceMeanIsTheMeanOverTheRanks) {
  for (int n : {2, 3, 4, 5, 8})
    for (int64_t bytes : {int64_t{4} * 7, int64_t{4} * 1000003, int64_t{64} << 20}) {
      int64_t sum = 0;
      for (int rank = 0; rank < n; ++rank) sum += ring_all_reduce_bytes(bytes, 4, rank, n);
      EXPECT_EQ(sum, 2 * (n - 1) * bytes) << n << " " << bytes;
      EXPECT_EQ(ring_all_reduce_mean_bytes(bytes, n), sum / n) << n << " " << bytes;
    }
  EXPECT_EQ(ring_all_reduce_mean_bytes(4096, 1), 0);
}

TEST(WireBytes, EachCollectiveKind) {
  // Gloo reduces the dtype: its ring; else fsdpp's reduce-scatter and all-gather of whole chunks.
  EXPECT_EQ(all_reduce_wire_bytes(10, 4, /*gloo_native=*/true, 1, 4), ring_all_reduce_bytes(40, 4, 1, 4));
  EXPECT_EQ(all_reduce_wire_bytes(10, 2, /*gloo_native=*/false, 1, 4), 2 * 3 * 3 * 2);
  EXPECT_EQ(all_reduce_wire_bytes(10, 2, /*gloo_native=*/false, 0, 1), 0);
  EXPECT_EQ(broadcast_wire_bytes(48, 0, 0, 4), 2 * 48);
  EXPECT_EQ(broadcast_string_wire_bytes(12, 0, 0, 4), 2 * (8 + 12));
  EXPECT_EQ(all_gather_wire_bytes(100, 4), 300);
  EXPECT_EQ(reduce_scatter_wire_bytes(100, 4), 300);
  EXPECT_EQ(all_to_all_wire_bytes({1, 2, 3}, 4, 1), (1 + 3) * 4);
}

}  // namespace
}  // namespace fsdpp::detail
