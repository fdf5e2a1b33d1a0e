// Device meshes: coordinates, sub-meshes, and per-dimension groups that talk only to their members.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/error.h>

#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

using testing::RankContext;

// Sums each member's global rank over a group: only its members may contribute.
int64_t sum_of_ranks(const ProcessGroup& group, int rank) {
  at::Tensor t = at::full({1}, rank, at::kLong);
  all_reduce(t, ReduceOp::SUM, group);
  return t.item<int64_t>();
}

TEST(DeviceMesh, TwoDimensionalMeshGroupsAndCoordinates) {
  testing::run_ranks(4, [](RankContext& ctx) {
    DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"replicate", "shard"});
    const int r = ctx.rank;
    EXPECT_EQ(mesh.ndim(), 2);
    EXPECT_EQ(mesh.size(), 4);
    EXPECT_EQ(mesh.get_coordinate(), (std::vector<int>{r / 2, r % 2}));
    EXPECT_EQ(mesh.get_local_rank("shard"), r % 2);
    EXPECT_EQ(mesh.get_local_rank("replicate"), r / 2);
    // shard groups are rows {0,1},{2,3}; replicate groups are columns {0,2},{1,3}.
    ProcessGroup shard = mesh.get_group("shard"), replicate = mesh.get_group("replicate");
    EXPECT_EQ(shard.ranks(), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
    EXPECT_EQ(replicate.ranks(), (std::vector<int>{r % 2, r % 2 + 2}));
    EXPECT_EQ(sum_of_ranks(shard, r), r / 2 * 2 + r / 2 * 2 + 1);
    EXPECT_EQ(sum_of_ranks(replicate, r), r % 2 + r % 2 + 2);
    DeviceMesh shard_mesh = mesh["shard"];
    EXPECT_EQ(shard_mesh.ndim(), 1);
    EXPECT_EQ(shard_mesh.ranks(), shard.ranks());
    EXPECT_EQ(shard_mesh.get_group().ranks(), shard.ranks());
    EXPECT_EQ(shard_mesh.get_local_rank(0), r % 2);
    // The same mesh again: new groups, still correct.
    DeviceMesh again = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
    EXPECT_EQ(sum_of_ranks(again.get_group("tp"), r), r / 2 * 2 + r / 2 * 2 + 1);
  });
}

TEST(DeviceMesh, ThreeDimensionalMesh) {
  testing::run_ranks(4, [](RankContext& ctx) {
    DeviceMesh mesh = init_device_mesh(ctx.world, {1, 2, 2}, {"pp", "dp", "tp"});
    const int r = ctx.rank;
    EXPECT_EQ(mesh.get_coordinate(), (std::vector<int>{0, r / 2, r % 2}));
    EXPECT_EQ(mesh.get_group("pp").size(), 1);
    EXPECT_EQ(sum_of_ranks(mesh.get_group("pp"), r), r);
    EXPECT_EQ(sum_of_ranks(mesh.get_group("tp"), r), r / 2 * 4 + 1);
    DeviceMesh dp_tp = mesh[std::vector<std::string>{"dp", "tp"}];
    EXPECT_EQ(dp_tp.shape(), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(dp_tp.ranks(), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(dp_tp.get_group("dp").ranks(), mesh.get_group("dp").ranks());
  });
}

TEST(DeviceMesh, MeshOverASubGroup) {
  testing::run_ranks(4, [](RankContext& ctx) {
    ProcessGroup odd = ctx.world.new_group({1, 3});
    if (!odd.is_member()) return;
    DeviceMesh mesh = init_device_mesh(odd, {2}, {"shard"});
    EXPECT_EQ(mesh.ranks(), (std::vector<int>{1, 3}));
    EXPECT_EQ(sum_of_ranks(mesh.get_group("shard"), ctx.rank), 4);
  });
}

TEST(DeviceMesh, Errors) {
  testing::run_ranks(2, [](RankContext& ctx) {
    std::string m = testing::error_of([&] { init_device_mesh(ctx.world, {3}); });
    EXPECT_NE(m.find("a mesh of 3 ranks does not match group world of size 2"), std::string::npos) << m;
    m = testing::error_of([&] { init_device_mesh(ctx.world, {2}, {"a", "b"}); });
    EXPECT_NE(m.find("2 dimension names (a, b) for a mesh of 1 dimensions"), std::string::npos) << m;
    DeviceMesh mesh = init_device_mesh(ctx.world, {1, 2}, {"replicate", "shard"});
    m = testing::error_of([&] { mesh["tp"]; });
    EXPECT_NE(m.find("no dimension named 'tp' in (replicate, shard)"), std::string::npos) << m;
    m = testing::error_of([&] { mesh.get_group(); });
    EXPECT_NE(m.find("needs a 1-D mesh"), std::string::npos) << m;
  });
}

}  // namespace
}  // namespace fsdpp
