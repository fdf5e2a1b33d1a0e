// TensorLayout, the one sharding rule, at world sizes 1-4. The reference is torch::chunk, which
// is how PyTorch's DTensor and FSDP2 split a tensor for Shard(d): rank r holds chunk r, or
// nothing when chunk() returned fewer pieces than ranks.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/sharded_tensor.h>
#include <fsdpp/tensor_layout.h>

#include "dist/world_sizes.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

using testing::error_of;
using testing::RankContext;
using testing::run_ranks;

class TensorLayoutTest : public testing::WorldSizeTest {};

// Rank r's part of `full` by torch.chunk along `dim`.
at::Tensor chunk_of(const at::Tensor& full, int64_t dim, int rank, int n) {
  auto chunks = full.chunk(n, dim);
  if (rank < static_cast<int>(chunks.size())) return chunks[rank];
  std::vector<int64_t> shape = full.sizes().vec();
  shape[dim] = 0;
  return at::empty(shape, full.options());
}

TEST_P(TensorLayoutTest, ShardFollowsTorchChunkAndRoundTripsThroughShardedTensor) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, r = ctx.rank;
    // Shapes with remainders, fewer rows than ranks, and a shard along dim 1.
    const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases{
        {{5, 3}, 0}, {{7}, 0}, {{2, 9}, 0}, {{3, 5}, 1}, {{1, 4}, 0}};
    for (const auto& [shape, dim] : cases) {
      SCOPED_TRACE("shape " + c10::str(at::IntArrayRef(shape)) + " Shard(" + std::to_string(dim) + ")");
      at::Tensor full = torch::arange(c10::multiply_integers(shape)).to(at::kFloat).view(shape);
      TensorLayout layout(shape, Placement::shard(dim), ctx.world);
      const at::Tensor expected = chunk_of(full, dim, r, n);
      EXPECT_EQ(layout.chunk_size(), (shape[dim] + n - 1) / n);
      EXPECT_EQ(layout.local_shape(r), expected.sizes().vec());
      EXPECT_TRUE(at::equal(layout.local_of_full(full), expected));
      // Shard metadata: only ranks with a non-empty chunk, at the chunk's offset.
      int64_t covered = 0;
      for (const auto& m : layout.shards_metadata()) {
        EXPECT_EQ(m.shard_offsets[dim], layout.local_offset(m.placement));
        EXPECT_EQ(m.shard_sizes, chunk_of(full, dim, m.placement, n).sizes().vec());
        covered += m.numel();
      }
      EXPECT_EQ(covered, full.numel());
      ShardedTensor st = layout.to_sharded_tensor(expected, /*copy=*/true);
      EXPECT_TRUE(layout.matches(st));
      EXPECT_TRUE(at::equal(st.full_tensor(), full));
      EXPECT_TRUE(at::equal(layout.local_from(st), expected));
    }
  });
}

// A 0-dim tensor is one slice: rank 0 holds it as shape [1], the others hold [0].
TEST_P(TensorLayoutTest, ZeroDimTensorIsOneSliceOnRankZero) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    at::Tensor full = torch::tensor(3.5f);
    TensorLayout layout({}, Placement::shard(0), ctx.world);
    const int64_t rows = ctx.rank == 0 ? 1 : 0;
    EXPECT_EQ(layout.local_shape(ctx.rank), std::vector<int64_t>{rows});
    at::Tensor local = layout.local_of_full(full);
    ASSERT_EQ(local.numel(), rows);
    if (rows) {
      EXPECT_EQ(local.item<float>(), 3.5f);
    }
    EXPECT_TRUE(at::equal(layout.to_sharded_tensor(local, true).full_tensor(), full));
  });
}

// A ShardedTensor laid out another way (all on rank 0, or a column split) is redistributed
// through its full_tensor(); one laid out as the layout says is read without communicating.
TEST_P(TensorLayoutTest, LocalFromRedistributesOnlyWhenLaidOutAnotherWay) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, r = ctx.rank;
    torch::manual_seed(7);  // the same tensor on every rank
    at::Tensor full = torch::randn({6, 2 * n});
    TensorLayout rows({6, 2 * n}, Placement::shard(0), ctx.world);
    std::vector<Shard> on_0;
    if (r == 0) on_0.push_back(Shard::from_tensor_and_offsets(full.clone(), {0, 0}, 0));
    ShardedTensor all_on_0 = ShardedTensor::from_local_shards(on_0, {6, 2 * n});
    ShardedTensor columns = ShardedTensor::from_local_shards(
        {Shard::from_tensor_and_offsets(full.narrow(1, 2 * r, 2).clone(), {0, 2 * r}, r)}, {6, 2 * n});
    EXPECT_EQ(rows.matches(all_on_0), n == 1);
    EXPECT_TRUE(at::equal(rows.local_from(all_on_0), chunk_of(full, 0, r, n)));
    ShardedTensor same = rows.to_sharded_tensor(chunk_of(full, 0, r, n), true);
    CommDebugMode comm;
    EXPECT_TRUE(at::equal(rows.local_from(same), chunk_of(full, 0, r, n)));
    EXPECT_EQ(comm.get_total_counts(), 0);
    EXPECT_TRUE(at::equal(rows.local_from(columns), chunk_of(full, 0, r, n)));
    EXPECT_EQ(comm.get_total_counts() > 0, n > 1);  // the redistribution all-gathers
  });
}

TEST_P(TensorLayoutTest, ReplicateHoldsTheWholeTensorAndRankZeroStandsForAll) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    at::Tensor full = torch::arange(6).to(at::kFloat).view({2, 3});
    TensorLayout layout({2, 3}, Placement::replicate(), ctx.world);
    EXPECT_EQ(layout.placements().front().to_string(), "Replicate()");
    EXPECT_EQ(layout.local_shape(ctx.rank), (std::vector<int64_t>{2, 3}));
    EXPECT_TRUE(at::equal(layout.local_of_full(full), full));
    ASSERT_EQ(layout.shards_metadata().size(), 1u);
    EXPECT_EQ(layout.shards_metadata().front().placement, 0);
    EXPECT_TRUE(at::equal(layout.to_sharded_tensor(full, true).full_tensor(), full));
  });
}

TEST_P(TensorLayoutTest, MisuseNamesThePlacementAndShapes) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    std::string e = error_of([&] { TensorLayout({4, 3}, Placement::shard(2), ctx.world); });
    EXPECT_NE(e.find("Shard(2) of a tensor of shape [4, 3]"), std::string::npos) << e;
    TensorLayout layout({4, 3}, Placement::shard(0), ctx.world);
    e = error_of([&] { layout.local_of_full(torch::zeros({3, 4})); });
    EXPECT_NE(e.find("shape [3, 4] for a tensor of shape [4, 3]"), std::string::npos) << e;
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(TensorLayoutTest);

}  // namespace
}  // namespace fsdpp
