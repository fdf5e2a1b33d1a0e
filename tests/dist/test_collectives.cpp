// Every collective at world sizes 1-4, with odd sizes and each dtype, against values each
// rank can compute alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "dist/collective_values.h"
#include "dist/world_sizes.h"
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

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kLong};

class Collectives : public testing::WorldSizeTest {};

TEST_P(Collectives, AllReduce) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (auto dtype : kDtypes)
      for (auto op : ops_for(dtype))
        for (int64_t numel : {1, 7, 13, 4096 + 3}) {
          at::Tensor t = rank_values(ctx.rank, numel, dtype);
          all_reduce(t, op);
          EXPECT_TRUE(at::equal(t, reduce_reference(ctx.world_size, numel, dtype, op)))
              << to_string(op) << " " << dtype << " numel " << numel;
        }
  });
}

TEST_P(Collectives, AllReduceMultiDimensional) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    at::Tensor t = rank_values(ctx.rank, 7 * 15, at::kFloat).view({7, 15});
    all_reduce(t, ReduceOp::SUM);
    EXPECT_TRUE(at::equal(t, reduce_reference(ctx.world_size, 7 * 15, at::kFloat, ReduceOp::SUM).view({7, 15})));
  });
}

TEST_P(Collectives, Broadcast) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (auto dtype : kDtypes)
      for (int src = 0; src < ctx.world_size; ++src) {
        at::Tensor t = rank_values(ctx.rank, 13, dtype);
        broadcast(t, src);
        EXPECT_TRUE(at::equal(t, rank_values(src, 13, dtype))) << dtype << " src " << src;
      }
  });
}

TEST_P(Collectives, AllGatherIntoTensor) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    for (auto dtype : kDtypes)
      for (int64_t numel : {1, 7, 15, 1000 + 1}) {
        at::Tensor input = rank_values(ctx.rank, numel, dtype);
        at::Tensor output = at::full({n * numel}, -1, dtype);
        all_gather_into_tensor(output, input);
        for (int r = 0; r < n; ++r)
          EXPECT_TRUE(at::equal(output.narrow(0, r * numel, numel), rank_values(r, numel, dtype)))
              << dtype << " numel " << numel << " chunk " << r;
      }
    // A (7, 15) parameter gathered as rows: the output may have any shape of the right size.
    at::Tensor input = rank_values(ctx.rank, 7 * 15, at::kFloat).view({7, 15});
    at::Tensor output = at::empty({n * 7, 15});
    all_gather_into_tensor(output, input);
    EXPECT_TRUE(at::equal(output.narrow(0, ctx.rank * 7, 7), input));
  });
}

TEST_P(Collectives, ReduceScatterTensor) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    for (auto dtype : kDtypes)
      for (auto op : ops_for(dtype))
        for (int64_t chunk : {1, 7, 1001}) {
          at::Tensor input = rank_values(ctx.rank, n * chunk, dtype);
          at::Tensor output = at::full({chunk}, -1, dtype);
          reduce_scatter_tensor(output, input, op);
          at::Tensor expected = reduce_reference(n, n * chunk, dtype, op).narrow(0, ctx.rank * chunk, chunk);
          EXPECT_TRUE(at::equal(output, expected)) << to_string(op) << " " << dtype << " chunk " << chunk;
        }
  });
}

TEST_P(Collectives, AllToAllSingleUnevenSplits) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, r = ctx.rank;
    // Rank i sends i + j + 1 rows of 3 to rank j; a row says (from, to, index).
    auto row_value = [](int from, int to, int index) { return from * 10000 + to * 100 + index; };
    std::vector<int64_t> in_splits, out_splits;
    std::vector<at::Tensor> rows;
    for (int j = 0; j < n; ++j) {
      in_splits.push_back(r + j + 1);
      out_splits.push_back(j + r + 1);
      for (int k = 0; k < r + j + 1; ++k) rows.push_back(at::full({1, 3}, row_value(r, j, k), at::kDouble));
    }
    at::Tensor input = at::cat(rows);
    int64_t out_rows = 0;
    for (auto s : out_splits) out_rows += s;
    at::Tensor output = at::empty({out_rows, 3}, at::kDouble);
    all_to_all_single(output, input, out_splits, in_splits);
    int64_t row = 0;
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < i + r + 1; ++k, ++row)
        EXPECT_EQ(output[row][2].item<double>(), row_value(i, r, k)) << "row " << row;
  });
}

TEST_P(Collectives, AllToAllSingleEqualSplitsBFloat16) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    at::Tensor input = (at::arange(n * 2) + 16 * ctx.rank).to(at::kBFloat16);
    at::Tensor output = at::empty({n * 2}, at::kBFloat16);
    all_to_all_single(output, input);
    for (int i = 0; i < n; ++i)
      EXPECT_TRUE(at::equal(output.narrow(0, 2 * i, 2), (at::arange(2) + 2 * ctx.rank + 16 * i).to(at::kBFloat16)));
  });
}

TEST_P(Collectives, Barrier) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const std::string marker = ctx.temp_dir + "/last-rank-was-here";
    if (ctx.rank == ctx.world_size - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::ofstream(marker) << "x";
    }
    barrier();
    EXPECT_TRUE(std::filesystem::exists(marker)) << "barrier returned before the last rank arrived";
  });
}

TEST_P(Collectives, BroadcastBytes) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (int src = 0; src < ctx.world_size; ++src) {
      for (const std::string& payload : {std::string(), std::string("a\0b\xff", 4), std::string(100000, 'z')}) {
        std::string bytes = ctx.rank == src ? payload : std::string("stale");
        broadcast_bytes(bytes, src);
        EXPECT_EQ(bytes, payload) << "src " << src << " size " << payload.size();
      }
    }
  });
}

TEST_P(Collectives, AsyncReturnsBeforeCompletionAndOverlapsCompute) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int last = ctx.world_size - 1;
    const std::string rank0_returned = ctx.temp_dir + "/rank0-returned";
    at::Tensor t = rank_values(ctx.rank, 1 << 20, at::kFloat);
    if (ctx.rank == last && ctx.world_size > 1) {
      // Join only once rank 0's call has returned: a blocking call would never return, and
      // this rank would give up (ordering, not timing).
      for (int i = 0; i < 3000 && !std::filesystem::exists(rank0_returned); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      EXPECT_TRUE(std::filesystem::exists(rank0_returned)) << "rank 0's async all_reduce did not return";
    }
    Work work = all_reduce(t, ReduceOp::SUM, {}, /*async_op=*/true);
    if (ctx.rank == 0 && ctx.world_size > 1) {
      // The last rank has not joined yet, so the collective cannot be complete...
      EXPECT_FALSE(work.is_completed());
      std::ofstream(rank0_returned) << "x";
    }
    // ...and this thread is free to compute meanwhile.
    at::Tensor a = at::randn({128, 128});
    at::Tensor product = at::mm(a, a);
    work.wait();
    EXPECT_TRUE(work.is_completed());
    EXPECT_TRUE(at::equal(t, reduce_reference(ctx.world_size, 1 << 20, at::kFloat, ReduceOp::SUM)));
    EXPECT_EQ(product.size(0), 128);
    // Several in flight at once complete in issue order with the right results.
    std::vector<at::Tensor> inputs;
    std::vector<Work> works;
    for (int i = 0; i < 5; ++i) {
      inputs.push_back(rank_values(ctx.rank, 100 + i, at::kDouble));
      works.push_back(all_reduce(inputs.back(), ReduceOp::MAX, {}, true));
    }
    for (int i = 0; i < 5; ++i) {
      works[i].wait();
      EXPECT_TRUE(at::equal(inputs[i], reduce_reference(ctx.world_size, 100 + i, at::kDouble, ReduceOp::MAX)));
    }
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(Collectives);

// Bad input: every misuse is an fsdpp::Error naming what was wrong, never a crash or a hang.
class CollectivesBadInput : public testing::WorldSizeTest {};

TEST_P(CollectivesBadInput, SizesThatDifferAcrossRanks) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    if (ctx.world_size == 1) return;
    const int odd = ctx.world_size - 1;
    at::Tensor t = at::ones({ctx.rank == odd ? 5 : 4});
    std::string message = error_of([&] { all_reduce(t); });
    EXPECT_NE(message.find("disagree"), std::string::npos) << message;
    EXPECT_NE(message.find("rank " + std::to_string(odd) + ": all_reduce #0 Float input 5 elements"), std::string::npos)
        << message;
    // The group stays usable after the error.
    at::Tensor ok = at::ones({3});
    all_reduce(ok);
    EXPECT_TRUE(at::equal(ok, at::full({3}, ctx.world_size)));

    at::Tensor input = at::ones({ctx.rank == odd ? 3 : 2});
    at::Tensor output = at::empty({input.numel() * ctx.world_size});
    message = error_of([&] { all_gather_into_tensor(output, input); });
    EXPECT_NE(message.find("disagree"), std::string::npos) << message;
  });
}

TEST_P(CollectivesBadInput, DifferentCollectivesAcrossRanks) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    if (ctx.world_size == 1) return;
    at::Tensor t = at::ones({4});
    std::string message = error_of([&] {
      if (ctx.rank == 0) broadcast(t, 0); else all_reduce(t);
    });
    EXPECT_NE(message.find("rank 0: broadcast #0"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1: all_reduce #0"), std::string::npos) << message;
  });
}

TEST_P(CollectivesBadInput, LocalMisuse) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    std::string m = error_of([&] { at::Tensor in = at::ones({3}), out = at::empty({3 * n + 1}); all_gather_into_tensor(out, in); });
    EXPECT_NE(m.find("must hold " + std::to_string(n) + " x input [3]"), std::string::npos) << m;
    m = error_of([&] { at::Tensor in = at::ones({3 * n}), out = at::empty({3}, at::kDouble); reduce_scatter_tensor(out, in); });
    EXPECT_NE(m.find("differ in dtype"), std::string::npos) << m;
    m = error_of([&] { all_reduce(at::ones({3}, at::kLong), ReduceOp::AVG); });
    EXPECT_NE(m.find("AVG needs a floating-point tensor, got Long"), std::string::npos) << m;
    m = error_of([&] { all_reduce(at::ones({3}, at::kBool)); });
    EXPECT_NE(m.find("cannot reduce a Bool tensor"), std::string::npos) << m;
    m = error_of([&] { all_reduce(at::ones({4, 4}).t()); });
    EXPECT_NE(m.find("is not contiguous"), std::string::npos) << m;
    m = error_of([&] { broadcast(at::ones({2}), n); });
    EXPECT_NE(m.find("global rank " + std::to_string(n) + " is not a member of group world"), std::string::npos) << m;
    m = error_of([&] { at::Tensor t = at::ones({n}); all_to_all_single(t, t, {}, std::vector<int64_t>(n + 1, 0)); });
    EXPECT_NE(m.find("split sizes have " + std::to_string(n + 1) + " entries"), std::string::npos) << m;
  });
}

TEST_P(CollectivesBadInput, MissingRankTimesOutNamingTheCollective) {
  testing::RunOptions options;
  options.collective_timeout = std::chrono::milliseconds(2000);
  options.check_collectives = false;  // the plain collective must time out by itself
  run_ranks(GetParam(), [](RankContext& ctx) {
    if (ctx.world_size == 1) return;
    if (ctx.rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(4));  // never calls all_gather
      return;
    }
    at::Tensor in = at::ones({8}), out = at::empty({8 * ctx.world_size});
    std::string m = error_of([&] { all_gather_into_tensor(out, in); });
    EXPECT_NE(m.find("all_gather_into_tensor(output [" + std::to_string(8 * ctx.world_size) + "] Float, input [8] Float) #0 on group world (rank " +
                     std::to_string(ctx.rank) + " of " + std::to_string(ctx.world_size) + ") failed"),
              std::string::npos)
        << m;
  }, options);
}

FSDPP_INSTANTIATE_WORLD_SIZES(CollectivesBadInput);

}  // namespace
}  // namespace fsdpp
