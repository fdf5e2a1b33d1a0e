// The device path by NCCL's contract, on CPU ranks: the NCCL-contract double
// (src/comm/nccl_contract_backend.h) returns a null Work, refuses NCCL's missing dtypes, ends each
// collective on a CPU comm stream after the launch returns (later still by a delay), has no
// timeout of its own, and records every launch. So these tests fail if fsdpp dereferences the null
// Work, hands NCCL a dtype it lacks, reads a collective's output without waiting for it, waits on
// the host without a bound under TORCH_NCCL_BLOCKING_WAIT=1, or launches from threads racing each
// other. What they cannot show: that a CUDA stream or allocator does what the CPU streams here
// stand for (tests/gpu), or which GPU an allocation lands on (tests/unit/test_storage_memory.cpp
// shows that on a stand-in accelerator of two devices).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "comm/chained_collectives.h"
#include "comm/device_handoff.h"
#include "comm/gather_layout.h"
#include "comm/nccl_contract_backend.h"
#include "comm/process_group_impl.h"
#include "compat/c10d_tensor_collectives.h"
#include "dist/collective_values.h"
#include "dist/hsdp_fixtures.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

using testing::error_of;
using testing::ops_for;
using testing::rank_values;
using testing::reduce_reference;
using testing::RankContext;
using testing::run_ranks;
using testing::RunOptions;

RunOptions over_contract() {
  RunOptions options;
  options.backend = "nccl-contract";
  return options;
}

// A delay longer than the host needs to issue a collective and read its output: a missing wait
// reads the output before the double wrote it.
void delay_every_collective() { detail::set_device_collective_delay(std::chrono::milliseconds(2)); }

// NCCL's dtypes and those it lacks (int16, uint16, uint32: widened to reduce, bytes to move).
const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kHalf,  at::kBFloat16, at::kChar,  at::kByte,
                                             at::kShort, at::kInt,    at::kLong,  at::kUInt16,   at::kUInt32};

// Compared in float64, which holds every value here exactly (and takes every dtype).
bool same_values(const at::Tensor& actual, const at::Tensor& expected) {
  return at::equal(actual.to(at::kDouble), expected.to(at::kDouble));
}

class NcclContract : public testing::WorldSizeTest {};

// Every collective x dtype over the double, each output read right after its wait.
TEST_P(NcclContract, EveryCollectiveAndDtype) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    delay_every_collective();
    const int n = ctx.world_size, r = ctx.rank;
    for (auto dtype : kDtypes)
      for (int64_t numel : {5, 1031}) {
        const std::string where = std::string(c10::toString(dtype)) + " numel " + std::to_string(numel);
        for (auto op : ops_for(dtype)) {
          at::Tensor t = rank_values(r, numel, dtype);
          all_reduce(t, op);
          EXPECT_TRUE(same_values(t, reduce_reference(n, numel, dtype, op))) << "all_reduce " << to_string(op) << " " << where;
          at::Tensor async = rank_values(r, numel, dtype);
          all_reduce(async, op, {}, /*async_op=*/true).wait();
          EXPECT_TRUE(same_values(async, reduce_reference(n, numel, dtype, op))) << "async all_reduce " << where;
          // Each rank's chunk of the reduction over n chunks of `numel`.
          at::Tensor input = rank_values(r, n * numel, dtype), output = at::zeros({numel}, input.options());
          reduce_scatter_tensor(output, input, op);
          EXPECT_TRUE(same_values(output, reduce_reference(n, n * numel, dtype, op).narrow(0, r * numel, numel)))
              << "reduce_scatter_tensor " << to_string(op) << " " << where;
        }
        at::Tensor b = r == n - 1 ? rank_values(r, numel, dtype) : at::zeros({numel}, dtype);
        broadcast(b, n - 1);
        EXPECT_TRUE(same_values(b, rank_values(n - 1, numel, dtype))) << "broadcast " << where;
        at::Tensor gathered = at::zeros({n * numel}, dtype);
        all_gather_into_tensor(gathered, rank_values(r, numel, dtype));
        for (int q = 0; q < n; ++q)
          EXPECT_TRUE(same_values(gathered.narrow(0, q * numel, numel), rank_values(q, numel, dtype)))
              << "all_gather_into_tensor block " << q << " " << where;
        // Rank q's block j goes to rank j as its block q.
        at::Tensor sent = (rank_values(r, n * numel, at::kLong) * 10 + r).to(dtype), received = at::zeros_like(sent);
        all_to_all_single(received, sent);
        for (int q = 0; q < n; ++q) {
          const at::Tensor from_q = (rank_values(q, n * numel, at::kLong) * 10 + q).narrow(0, r * numel, numel);
          EXPECT_TRUE(same_values(received.narrow(0, q * numel, numel), from_q.to(dtype)))
              << "all_to_all_single from rank " << q << " " << where;
        }
        if (::testing::Test::HasFailure()) return;
      }
    at::Tensor flags = at::zeros({n * 3}, at::kBool);
    all_gather_into_tensor(flags, at::full({3}, r % 2 == 1, at::kBool));
    for (int q = 0; q < n; ++q) EXPECT_EQ(flags[q * 3].item<bool>(), q % 2 == 1) << "bool all_gather block " << q;
  }, over_contract());
}

// FSDP's gather into its parameter-major layout, placed on the device path (one strided copy per
// parameter, by GatherLayout::rank_output_offset as the host's copies): padded chunks of 3, 0
// and 2 elements; rank q's block holds 100 q + 10 i + j (parameter i's element j).
TEST_P(NcclContract, AllGatherIntoLayoutPlacesEachRanksChunksWithTheParameter) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    delay_every_collective();
    const int n = ctx.world_size;
    auto layout = std::make_shared<detail::GatherLayout>();
    layout->block_numel = 5;
    layout->ranks = n;
    layout->pieces = {{0, 3, 0}, {3, 0, 3 * n}, {3, 2, 3 * n}};
    const auto block = [](int64_t q) { return at::tensor(std::vector<int64_t>{0, 1, 2, 20, 21}) + 100 * q; };
    at::Tensor output = at::zeros({5 * n}, at::kLong);
    detail::all_gather_into_layout(output, block(ctx.rank), layout, ctx.world, {}).wait();
    std::vector<at::Tensor> expected;  // parameter 0's chunks of every rank, then parameter 2's
    for (int q = 0; q < n; ++q) expected.push_back(block(q).narrow(0, 0, 3));
    for (int q = 0; q < n; ++q) expected.push_back(block(q).narrow(0, 3, 2));
    EXPECT_TRUE(at::equal(output, at::cat(expected))) << output;
  }, over_contract());
}

INSTANTIATE_TEST_SUITE_P(, NcclContract, ::testing::Values(2, 3), testing::world_size_name);

// What the double refuses is what ProcessGroupNCCL refuses, so fsdpp's widening and byte moves
// above are what make those dtypes pass.
TEST(NcclContractDouble, RefusesWhatNcclRefusesWithItsMessage) {
  run_ranks(2, [](RankContext& ctx) {
    auto& backend = *detail::member_group(ctx.world, "test").device_backend;
    std::vector<at::Tensor> shorts{at::ones({4}, at::kShort)};
    try {
      backend.allreduce(shorts);
      ADD_FAILURE() << "an int16 all-reduce was accepted";
    } catch (const c10::TypeError& e) {
      EXPECT_NE(std::string(e.what()).find("Input tensor data type is not supported for NCCL process group: Short"),
                std::string::npos)
          << e.what();
    }
    std::vector<at::Tensor> float8{at::ones({4}).to(at::kFloat8_e4m3fn)};
    EXPECT_THROW(backend.allreduce(float8), c10::TypeError);
    // asyncOp = false: launched on the current stream, a null Work (on 2.7+).
    std::vector<at::Tensor> floats{at::ones({4})};
    c10d::AllreduceOptions on_current;
    compat::queue_on_current_stream(on_current);
    const auto work = backend.allreduce(floats, on_current);
    EXPECT_EQ(static_cast<bool>(work), !compat::asks_current_stream(on_current));
    if (work) work->wait();
    EXPECT_TRUE(at::equal(floats[0], at::full({4}, 2.0f)));  // the CPU compute stream waited at the launch
  }, over_contract());
}

// Launches in their canonical form: each communicator named by the order it first launched in,
// so that ranks of different subgroups compare equal when their programs are.
std::string canonical_launches() {
  std::map<std::string, int> index;
  std::ostringstream out;
  for (const auto& launch : detail::nccl_contract_launches()) {
    const int c = index.emplace(launch.communicator, static_cast<int>(index.size())).first->second;
    out << "c" << c << " " << launch.collective << " #" << launch.seq << "\n";
  }
  return out.str();
}

// The first line where two canonical launch lists differ, for the message.
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream x(a), y(b);
  std::string lx, ly;
  for (int line = 0;; ++line) {
    const bool more_x = static_cast<bool>(std::getline(x, lx)), more_y = static_cast<bool>(std::getline(y, ly));
    if (!more_x && !more_y) return "none";
    if (lx != ly || more_x != more_y)
      return "launch " + std::to_string(line) + ": '" + (more_x ? lx : "end") + "' vs '" + (more_y ? ly : "end") + "'";
  }
}

// HSDP on a 2 x 2 mesh (shard groups, replicate groups and the world for DDP, the reference): the
// reduce-scatter, the replicate all-reduce chained after it and the next unit's prefetch are
// issued close together on three communicators. Launched from one thread in program order, every
// rank launches them in one order, however long each launch takes; launched from the groups'
// comm threads (each when host timing lets it) the orders differ across ranks, which on NCCL is
// the classic deadlock. The training also matches DDP with every collective's end delayed, so
// every consumer waited (FSDP2's stream discipline).
TEST(NcclContractFullyShard, HsdpLaunchesOneGlobalOrderAndMatchesDDP) {
  run_ranks(4, [](RankContext& ctx) {
    delay_every_collective();
    detail::set_nccl_contract_launch_jitter(std::chrono::microseconds(500));
    detail::clear_nccl_contract_launches();
    const auto options = FullyShardOptions().mesh(hsdp_mesh(ctx, 2, 2));
    HSDPCase sync_every_batch{/*reshard_after_forward=*/true, false, 16, /*sync_gradients_at_last_batch=*/false};
    HSDPCase reduce_scatter_only{/*reshard_after_forward=*/false, false, 17, true, /*reduce_scatter_only=*/true};
    for (const auto& c : {sync_every_batch, reduce_scatter_only}) {
      check_parity_with_ddp(ctx, options, 2, c);
      if (::testing::Test::HasFailure()) return;
    }
    detail::set_nccl_contract_launch_jitter(std::chrono::microseconds(0));
    std::string mine = canonical_launches(), rank0 = mine;
    EXPECT_GT(detail::nccl_contract_launches().size(), 100u);
    broadcast_bytes(rank0, 0, ctx.world);
    EXPECT_EQ(mine, rank0) << "rank " << ctx.rank << " launched in another order than rank 0; first difference at "
                           << first_difference(mine, rank0);
  }, over_contract());
}

// TORCH_NCCL_BLOCKING_WAIT=1: the host waits for each device collective's end, up to the group's
// timeout, and a rank that never launches is named as NCCL's flight recorder would.
TEST(NcclContractFullyShard, BlockingWaitTimesOutNamingTheMissingRank) {
  RunOptions options = over_contract();
  options.env = {"TORCH_NCCL_BLOCKING_WAIT=1"};
  options.collective_timeout = std::chrono::milliseconds(2000);
  options.check_collectives = false;  // the device wait, not the intent check's, must time out
  options.deadline = std::chrono::seconds(60);
  run_ranks(2, [](RankContext& ctx) {
    const std::string reported = ctx.temp_dir + "/reported";
    if (ctx.rank == 1) {  // never launches it; leaves once rank 0 has reported
      while (!std::filesystem::exists(reported)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return;
    }
    at::Tensor t = at::ones({8});
    const std::string error = error_of([&] { all_reduce(t, ReduceOp::SUM); });
    std::ofstream(reported) << "done";
    EXPECT_NE(error.find("all_reduce"), std::string::npos) << error;
    EXPECT_NE(error.find("timed out after 2 s"), std::string::npos) << error;
    EXPECT_NE(error.find("rank(s) [1] had not arrived"), std::string::npos) << error;
  }, options);
}

}  // namespace
}  // namespace fsdpp
