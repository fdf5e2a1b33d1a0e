// BACKWARD_PRE_WITHIN_BOUND's rule (src/fsdp/prefetch_within_bound.h) on windows computed by
// hand: each case sits at the bound, so one byte more in any term flips a decision. The engine
// and fsdpp-plan both decide by it; their own tests (BackwardPrefetchWithinBound, PlanFormulas)
// see only its outcome on real models, where a changed term rarely changes a decision.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "fsdp/prefetch_within_bound.h"

namespace fsdpp::detail {
namespace {

// An FSDP root (unit 0) over two blocks (units 1, 2), as the engine orders them: backward runs
// root, block 1, block 0; the root prefetches block 1, block 1 prefetches block 0, block 0
// nothing. Gathered: root 10, blocks 100 (largest 100); reduce-scatter inputs 10, 100, 200 over
// a shard group of 2, so with their outputs a unit's reduce-scatter holds 15, 150, 300.
std::vector<bool> decide(std::vector<int64_t> peak, int64_t live_after_forward) {
  BackwardWindows windows{std::move(peak), {0, 2, 1}, live_after_forward};
  const std::vector<PrefetchUnit> units{{10, 10, 2, 2}, {100, 100, 2, -1}, {100, 200, 2, 1}};
  return decide_prefetch_within_bound(windows, units);
}

TEST(PrefetchWithinBound, EachUnitPrefetchesWhenBothWindowsStayWithinTheBound) {
  // Bound: live after forward + 2 x largest = 1000 + 200 = 1200 (above every window's peak).
  // Root: 1100 + block 1 (100) = 1200; block 1's window then holds the root's reduce-scatter:
  // 1085 + 15 = 1100. Block 1: 1085 + the root's held over (15) + block 0 (100) = 1200; block 0's
  // window then holds block 1's reduce-scatter: 900 + 300 = 1200.
  EXPECT_EQ(decide({1100, 900, 1085}, 1000), (std::vector<bool>{true, false, true}));
}

TEST(PrefetchWithinBound, ReduceScatterHeldOverFromThePrefetcherCounts) {
  // Block 1's window one byte higher: 1086 + 15 + 100 = 1201 (1186 without the root's held over).
  EXPECT_EQ(decide({1100, 900, 1086}, 1000), (std::vector<bool>{true, false, false}));
}

TEST(PrefetchWithinBound, PrefetchedUnitsWindowHoldsTheReduceScatterInputAndOutput) {
  // Block 0's window one byte higher: 901 + 300 = 1201 (1101 with the input alone).
  EXPECT_EQ(decide({1100, 901, 1085}, 1000), (std::vector<bool>{true, false, false}));
  // The root's side: block 1's window at 1186 leaves the root 1186 + 15 = 1201.
  EXPECT_EQ(decide({1100, 600, 1186}, 1000), (std::vector<bool>{false, false, false}));
}

TEST(PrefetchWithinBound, BoundIsTheBackwardsPeakWhenThatIsHigher) {
  // live + 2 x largest = 200; the highest window (the root's, 1100) is the bound. The root:
  // 1100 + 100 > 1100; block 1: 900 + 100 = 1000 and block 0's 700 + 300 = 1000.
  EXPECT_EQ(decide({1100, 700, 900}, 0), (std::vector<bool>{false, false, true}));
}

TEST(PrefetchWithinBound, UnmeasuredWindowsDecideNothingAndHoldNothing) {
  // The root's window not reached: it does not prefetch, and holds nothing over into block 1's;
  // block 0's not reached: nothing to check there. Bound 1200: 1100 + 100 fits.
  EXPECT_EQ(decide({-1, -1, 1100}, 1000), (std::vector<bool>{false, false, true}));
}

}  // namespace
}  // namespace fsdpp::detail
