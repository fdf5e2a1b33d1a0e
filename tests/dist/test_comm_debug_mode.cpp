// CommDebugMode reports, per collective, the calls and the exact bytes this rank sent.
#include <gtest/gtest.h>

#include <fstream>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>
#include <fsdpp/comm_debug_mode.h>

#include "comm/wire_bytes.h"
#include "dist/world_sizes.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

using testing::RankContext;

class CommDebugModeTest : public testing::WorldSizeTest {};

TEST_P(CommDebugModeTest, CountsCallsAndBytesPerCollective) {
  testing::run_ranks(GetParam(), [](RankContext& ctx) {
    const int64_t n = ctx.world_size;
    CommDebugMode outer;
    {
      CommDebugMode mode;
      // all_gather and reduce_scatter: (N-1)/N of the full buffer, exactly.
      at::Tensor shard = at::ones({1000}), full = at::empty({1000 * n});
      all_gather_into_tensor(full, shard);
      all_gather_into_tensor(full, shard);
      reduce_scatter_tensor(shard, full);
      EXPECT_EQ(mode.count("all_gather_into_tensor"), 2);
      EXPECT_EQ(mode.bytes_sent("all_gather_into_tensor"), 2 * (n - 1) * 4000);
      EXPECT_EQ(mode.count("reduce_scatter_tensor"), 1);
      EXPECT_EQ(mode.bytes_sent("reduce_scatter_tensor"), (n - 1) * 4000);
      // bfloat16 all_reduce goes through reduce_scatter + all_gather of padded chunks.
      at::Tensor bf = at::ones({10}, at::kBFloat16);
      all_reduce(bf);
      EXPECT_EQ(mode.bytes_sent("all_reduce"), 2 * (n - 1) * ((10 + n - 1) / n) * 2);
      // float all_reduce follows Gloo's ring.
      at::Tensor f = at::ones({1 << 16});
      all_reduce(f);
      EXPECT_EQ(mode.bytes_sent("all_reduce") - 2 * (n - 1) * ((10 + n - 1) / n) * 2,
                detail::ring_all_reduce_bytes(4 << 16, 4, ctx.rank, n));
      // all_to_all_single: what this rank sends to the others.
      at::Tensor a = at::ones({n * 3}), b = at::empty({n * 3});
      all_to_all_single(b, a);
      EXPECT_EQ(mode.bytes_sent("all_to_all_single"), (n - 1) * 3 * 4);
      broadcast(a, 0);
      EXPECT_EQ(mode.bytes_sent("broadcast"), detail::tree_broadcast_sends(ctx.rank, 0, n) * n * 3 * 4);
      barrier();
      EXPECT_EQ(mode.count("barrier"), 1);
      EXPECT_EQ(mode.get_total_counts(), 8);
      auto counts = mode.get_comm_counts();
      EXPECT_EQ(counts.size(), 6u);
      EXPECT_EQ(counts["all_reduce"], 2);
    }
    // Nested modes both see everything; a finished mode sees nothing more.
    EXPECT_EQ(outer.get_total_counts(), 8);
    outer.reset();
    EXPECT_EQ(outer.get_total_counts(), 0);
    EXPECT_EQ(outer.total_bytes_sent(), 0);
  });
}

TEST_P(CommDebugModeTest, TreeBroadcastSendsAddUpToOneCopyPerReceiver) {
  const int n = GetParam();
  for (int root = 0; root < n; ++root) {
    int64_t total = 0;
    for (int r = 0; r < n; ++r) total += detail::tree_broadcast_sends(r, root, n);
    EXPECT_EQ(total, n - 1) << "root " << root;
  }
}

// The counts are not a model only: the kernel's count of bytes this process wrote (sockets
// included) must equal them, plus Gloo's small per-message headers.
int64_t kernel_bytes_written() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value)
    if (key == "wchar:") return value;
  return -1;
}

TEST_P(CommDebugModeTest, CountedBytesAreWhatTheKernelSent) {
  testing::RunOptions options;
  options.check_collectives = false;  // its small exchange would add bytes of its own
  // The counts model a network: over the same-host shared memory no socket carries them.
  options.env = {"FSDPP_SHARED_MEMORY=0"};
  testing::run_ranks(GetParam(), [](RankContext& ctx) {
    const int64_t n = ctx.world_size;
    at::Tensor full = at::ones({1000003 / n * n}), shard = at::ones({1000003 / n});
    at::Tensor bf = at::ones({1000003}, at::kBFloat16);
    // Over 2N MiB Gloo's ring cuts more than 2N segments, and their size from their number.
    at::Tensor large = at::ones({2500007});
    auto check = [&](const char* what, auto&& call) {
      CommDebugMode mode;
      const int64_t before = kernel_bytes_written();
      call();
      const int64_t written = kernel_bytes_written() - before;
      EXPECT_GE(written, mode.total_bytes_sent()) << what;
      EXPECT_LE(written, mode.total_bytes_sent() + 16384) << what;  // headers of at most a few hundred messages
      const bool tree_leaf = std::string(what) == "broadcast" && detail::tree_broadcast_sends(ctx.rank, 0, n) == 0;
      if (n > 1 && !tree_leaf) {
        EXPECT_GT(mode.total_bytes_sent(), 0) << what;
      }
    };
    check("all_gather_into_tensor", [&] { all_gather_into_tensor(full, shard); });
    check("reduce_scatter_tensor", [&] { reduce_scatter_tensor(shard, full); });
    check("all_reduce float32", [&] { all_reduce(full); });
    check("all_reduce float32 of more than 2N MiB", [&] { all_reduce(large); });
    check("all_reduce bfloat16", [&] { all_reduce(bf); });
    check("broadcast", [&] { broadcast(full, 0); });
  }, options);
}

FSDPP_INSTANTIATE_WORLD_SIZES(CommDebugModeTest);

}  // namespace
}  // namespace fsdpp
