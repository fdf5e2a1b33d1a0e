// The multi-process harness itself: a failing rank fails the test with its message, a hung
// rank is killed at the deadline and named, and a passing run passes.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "harness/multi_process.h"

namespace fsdpp::testing {
namespace {

TEST(Harness, EveryRankRunsWithItsOwnRank) {
  run_ranks(3, [](RankContext& ctx) {
    EXPECT_EQ(ctx.world.rank(), ctx.rank);
    EXPECT_EQ(ctx.world.size(), 3);
    std::ofstream(ctx.temp_dir + "/seen" + std::to_string(ctx.rank)) << "x";
  });
}

void rank_one_throws() {
  run_ranks(2, [](RankContext& ctx) {
    if (ctx.rank == 1) throw std::runtime_error("rank one broke");
  });
}

TEST(Harness, ExceptionOnOneRankFailsTheTestNamingIt) {
  EXPECT_NONFATAL_FAILURE(rank_one_throws(), "rank 1 of 2 failed (exited with code 1):\nuncaught exception: rank one broke");
}

void rank_zero_hangs() {
  RunOptions options;
  options.deadline = std::chrono::seconds(3);
  options.init_process_group = false;  // rank 1 finishes alone, without a final barrier
  run_ranks(2, [](RankContext& ctx) {
    if (ctx.rank == 0) std::this_thread::sleep_for(std::chrono::seconds(100));
  }, options);
}

TEST(Harness, HungRankIsKilledAtTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NONFATAL_FAILURE(rank_zero_hangs(), "rank 0 of 2 did not finish within the deadline of 3 s");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

void rank_one_crashes() {
  run_ranks(2, [](RankContext& ctx) {
    if (ctx.rank == 1) raise(SIGSEGV);
  });
}

TEST(Harness, CrashedRankIsReportedWithItsSignal) {
  EXPECT_NONFATAL_FAILURE(rank_one_crashes(), "rank 1 of 2 failed (died of signal");
}

}  // namespace
}  // namespace fsdpp::testing
