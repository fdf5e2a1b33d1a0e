// The same-host shared-memory transport (src/comm/shm_transport.h) against Gloo's: the same
// bits for every collective it carries, multi-round sizes included, and a peer that exits in
// the middle of an exchange ends it at once, naming the rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <unistd.h>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>

#include "comm/shm_transport.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

using testing::RankContext;
using testing::run_ranks;

class SharedMemoryTransport : public ::testing::TestWithParam<int> {};

// A group over the same ranks whose bytes go through Gloo: the setting is read when a group's
// first exchange decides its transport.
ProcessGroup gloo_copy_of(const ProcessGroup& world) {
  setenv("FSDPP_SHARED_MEMORY", "0", 1);
  std::vector<int> ranks(world.size());
  for (int r = 0; r < world.size(); ++r) ranks[r] = r;
  ProcessGroup gloo = world.new_group(ranks);
  barrier(gloo);
  all_gather_into_tensor(at::empty({world.size()}), at::zeros({1}), gloo);
  unsetenv("FSDPP_SHARED_MEMORY");
  return gloo;
}

// Lets the world group decide on shared memory and returns a Gloo group over the same ranks
// (each rank seeded apart).
ProcessGroup shared_memory_world_and_gloo_copy(RankContext& ctx) {
  all_gather_into_tensor(at::empty({ctx.world_size}), at::zeros({1}));
  ProcessGroup gloo = gloo_copy_of(ctx.world);
  at::manual_seed(ctx.rank + 1);
  return gloo;
}

TEST_P(SharedMemoryTransport, SameBitsAsGloo) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    const ProcessGroup gloo = shared_memory_world_and_gloo_copy(ctx);
    ASSERT_TRUE(detail::uses_shared_memory(ctx.world));
    ASSERT_FALSE(detail::uses_shared_memory(gloo));
    // 600,001 floats per rank's chunk span several 2 MiB rounds, and end in a partial one.
    for (auto dtype : {at::kFloat, at::kBFloat16})
      for (int64_t chunk : {1, 1001, 600001}) {
        const std::string what = std::string(c10::toString(dtype)) + " chunk " + std::to_string(chunk);
        at::Tensor input = at::randn({n * chunk}).to(dtype);
        at::Tensor shm_out = at::empty({n * n * chunk}, dtype), gloo_out = at::empty({n * n * chunk}, dtype);
        all_gather_into_tensor(shm_out, input);
        all_gather_into_tensor(gloo_out, input, gloo);
        EXPECT_TRUE(at::equal(shm_out, gloo_out)) << "all_gather " << what;
        for (auto op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MIN, ReduceOp::MAX}) {
          at::Tensor shm_part = at::empty({chunk}, dtype), gloo_part = at::empty({chunk}, dtype);
          reduce_scatter_tensor(shm_part, input, op);
          reduce_scatter_tensor(gloo_part, input, op, gloo);
          EXPECT_TRUE(at::equal(shm_part, gloo_part)) << "reduce_scatter " << to_string(op) << " " << what;
        }
        // In place: the input is the output, or the output is this rank's chunk of the input.
        at::Tensor gathered = at::empty({n * chunk}, dtype);
        gathered.narrow(0, ctx.rank * chunk, chunk).copy_(input.narrow(0, 0, chunk));
        all_gather_into_tensor(gathered, gathered.narrow(0, ctx.rank * chunk, chunk));
        all_gather_into_tensor(gloo_out.narrow(0, 0, n * chunk), input.narrow(0, 0, chunk), gloo);
        EXPECT_TRUE(at::equal(gathered, gloo_out.narrow(0, 0, n * chunk))) << "in-place all_gather " << what;
        at::Tensor scattered = input.clone();
        reduce_scatter_tensor(scattered.narrow(0, ctx.rank * chunk, chunk), scattered);
        at::Tensor gloo_part = at::empty({chunk}, dtype);
        reduce_scatter_tensor(gloo_part, input, ReduceOp::SUM, gloo);
        EXPECT_TRUE(at::equal(scattered.narrow(0, ctx.rank * chunk, chunk), gloo_part)) << "in-place reduce_scatter " << what;
      }
  });
}

// all_reduce over shared memory adds in Gloo's ring order (src/comm/gloo_ring_order.h), so the
// very bits of Gloo's all_reduce at every world size: one element; 7 and 10, which Gloo cuts
// unlike an even split (7 at 3 ranks, 10 at 4: 4 + 4 + 2 + 0); 1001; and one element past
// 2N MiB, where Gloo goes from 2 to 3 segments per chunk (several shared-memory rounds).
TEST_P(SharedMemoryTransport, AllReduceSameBitsAsGloo) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    const ProcessGroup gloo = shared_memory_world_and_gloo_copy(ctx);
    ASSERT_TRUE(detail::uses_shared_memory(ctx.world));
    ASSERT_FALSE(detail::uses_shared_memory(gloo));
    for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
      const int64_t element = c10::elementSize(dtype);
      for (int64_t numel : {int64_t{1}, int64_t{7}, int64_t{10}, int64_t{1001}, (int64_t{2} * n << 20) / element + 1}) {
        const std::string what = std::string(c10::toString(dtype)) + " numel " + std::to_string(numel);
        at::Tensor input = at::randn({numel}, at::kDouble).mul_(3).to(dtype);
        for (auto op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX}) {
          at::Tensor shm_sum = input.clone(), gloo_sum = input.clone();
          all_reduce(shm_sum, op);
          all_reduce(gloo_sum, op, gloo);
          EXPECT_TRUE(at::equal(shm_sum, gloo_sum))
              << "all_reduce " << to_string(op) << " " << what << ": "
              << at::ne(shm_sum, gloo_sum).sum().item<int64_t>() << " elements differ";
          at::Tensor everyone = at::empty({n, numel}, dtype);
          all_gather_into_tensor(everyone, shm_sum, gloo);
          for (int q = 0; q < n; ++q)
            EXPECT_TRUE(at::equal(everyone[q], shm_sum)) << "rank " << q << "'s all_reduce " << what;
        }
      }
    }
  });
}

TEST_P(SharedMemoryTransport, PeerExitEndsTheExchangeNamingTheRank) {
  testing::RunOptions options;
  options.check_collectives = false;  // the exchange itself must notice, not the check before it
  options.collective_timeout = std::chrono::milliseconds(60000);
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, last = n - 1;
    all_gather_into_tensor(at::empty({n}), at::zeros({1}));
    ASSERT_TRUE(detail::uses_shared_memory(ctx.world));
    if (ctx.rank == last) {  // this process ends without joining the next exchange
      std::fflush(nullptr);
      ::_exit(0);
    }
    at::Tensor in = at::ones({1 << 20}), out = at::empty({n << 20});
    const auto start = std::chrono::steady_clock::now();
    std::string m = testing::error_of([&] { all_gather_into_tensor(out, in); });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(m.find("all_gather_into_tensor(output [" + std::to_string(n << 20) + "] Float"), std::string::npos) << m;
    EXPECT_NE(m.find("rank " + std::to_string(last)), std::string::npos) << m;
    EXPECT_LT(seconds, 20) << m;
  }, options);
}

// A failed exchange leaves the members at different rounds: every later exchange of the group
// must fail at once, never hand back a buffer of another round.
TEST_P(SharedMemoryTransport, AfterAFailureLaterExchangesFail) {
  testing::RunOptions options;
  options.check_collectives = false;
  options.collective_timeout = std::chrono::milliseconds(1000);
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, last = n - 1;
    all_gather_into_tensor(at::empty({n}), at::zeros({1}));
    ASSERT_TRUE(detail::uses_shared_memory(ctx.world));
    at::Tensor in = at::ones({1 << 20}), out = at::empty({n << 20});
    if (ctx.rank == last) std::this_thread::sleep_for(std::chrono::seconds(4));  // the others time out
    std::string first = testing::error_of([&] { all_gather_into_tensor(out, in); });
    EXPECT_NE(first.find("all_gather_into_tensor"), std::string::npos) << first;
    std::string later = testing::error_of([&] { all_gather_into_tensor(out, in); });
    EXPECT_NE(later.find("shared-memory exchange closed"), std::string::npos) << later;
  }, options);
}

INSTANTIATE_TEST_SUITE_P(, SharedMemoryTransport, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "WorldSize" + std::to_string(info.param); });

}  // namespace
}  // namespace fsdpp
