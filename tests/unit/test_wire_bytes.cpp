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

}  // namespace
}  // namespace fsdpp::detail
