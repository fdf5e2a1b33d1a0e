// FSDP x TP on a 3-D (pp, dp, tp) mesh (seed 001's TestFullyShardNDTraining): the seed's MLPStack
// parallelized over mesh["tp"] and fully_shard over mesh["dp"], at parity with DDP of the plain
// model over the dp group. The seed takes mesh["pp"] and uses it for nothing: with pp > 1 (8
// GPUs) each pp coordinate trains its own copy of the 2-D model on its own (dp, tp) slice.
#include <algorithm>
#include <set>

#include <fsdpp/device_mesh.h>

#include "dist/fully_shard_2d_fixtures.h"

namespace fsdpp {
namespace {

// The 1-D sub-mesh `name` of a 3-D mesh: the members sharing this rank's other coordinates.
void expect_sub_mesh(const DeviceMesh& mesh, const std::string& name, const std::vector<int>& ranks, int rank) {
  const DeviceMesh sub = mesh[name];
  EXPECT_EQ(sub.ndim(), 1) << name;
  EXPECT_EQ(sub.mesh_dim_names(), std::vector<std::string>{name});
  EXPECT_EQ(sub.ranks(), ranks) << name;
  EXPECT_EQ(sub.get_group().ranks(), ranks) << name;
  EXPECT_EQ(mesh.get_group(name).ranks(), ranks) << name;
  const auto it = std::find(ranks.begin(), ranks.end(), rank);
  ASSERT_TRUE(it != ranks.end()) << name;
  EXPECT_EQ(sub.get_local_rank(0), it - ranks.begin()) << name;
  EXPECT_EQ(mesh.get_local_rank(name), it - ranks.begin()) << name;
}

std::string placements(const TensorLayout& layout) {
  std::string out;
  for (const Placement& p : layout.placements()) out += (out.empty() ? "" : ", ") + p.to_string();
  return out;
}

// The seed's closing check, that every parameter is a DTensor on the 2-D ("dp", "tp") mesh with
// two placements: here every parameter is sharded by an FSDP unit over the dp group (Shard(0) of
// its TP-local part) and parallelized over the tp group (in_proj Shard(0), out_proj weight
// Shard(1) and bias Replicate), and the model holds no other parameter.
void expect_2d_parameters(torch::nn::Module& model, const DeviceMesh& dp_mesh, const DeviceMesh& tp_mesh,
                          const std::string& label) {
  std::map<const c10::TensorImpl*, TensorParallelParameter> tp;
  for (const auto& p : tensor_parallel_parameters(model)) tp.emplace(p.param.unsafeGetTensorImpl(), p);
  std::set<const c10::TensorImpl*> sharded;
  for (FSDPModule* unit : fsdp_units(model)) {
    EXPECT_EQ(unit->process_group().ranks(), dp_mesh.ranks()) << label;
    for (const auto& s : unit->sharded_parameters()) {
      const std::string what = label + " " + s.name;
      sharded.insert(s.param.unsafeGetTensorImpl());
      EXPECT_EQ(placements(s.layout), "Shard(0)") << what;
      EXPECT_EQ(s.layout.process_group().ranks(), dp_mesh.ranks()) << what;
      auto it = tp.find(s.param.unsafeGetTensorImpl());
      ASSERT_TRUE(it != tp.end()) << what << " is not tensor-parallel";
      const TensorLayout& tp_layout = it->second.layout;
      EXPECT_EQ(tp_layout.process_group().ranks(), tp_mesh.ranks()) << what;
      // FSDP shards the TP-local part: its global shape is this tp rank's part.
      EXPECT_EQ(s.layout.global_shape(), tp_layout.local_shape(tp_mesh.get_local_rank(0))) << what;
      const bool in_proj = s.name.find("in_proj") != std::string::npos;
      const bool weight = s.name.find("weight") != std::string::npos;
      EXPECT_EQ(placements(tp_layout), in_proj ? "Shard(0)" : weight ? "Shard(1)" : "Replicate()") << what;
    }
  }
  const auto params = model.named_parameters();
  EXPECT_EQ(params.size(), 12u) << label;
  for (const auto& p : params)
    EXPECT_EQ(sharded.count(p.value().unsafeGetTensorImpl()), 1u) << label << " " << p.key() << " is not FSDP-sharded";
}

// _test_2d_mlp_with_nd_mesh: the 2-D parity loop on the 3-D mesh's dp and tp sub-meshes
// (check_2d_parity), then the trained model's 2-D layout. The pp sub-mesh is used for nothing, as
// in the seed. Inputs differ across pp slices (the seed's are seeded by the dp rank only), so
// that a collective crossing slices shows.
void check_2d_mlp_with_nd_mesh(const DeviceMesh& mesh, const Case2D& c) {
  const DeviceMesh dp_mesh = mesh["dp"], tp_mesh = mesh["tp"];
  FSDPSequential model{nullptr};
  check_2d_parity(dp_mesh, tp_mesh, c, /*input_seed=*/100 * mesh.get_local_rank("pp"), &model);
  if (::testing::Test::HasFailure()) return;
  expect_2d_parameters(*model, dp_mesh, tp_mesh, describe(c));
}

// The seed sweeps reshard_after_forward F/T x activation checkpointing F/T x mlp_dim 3 / 16 / 17
// (12 runs, ~7 s here on the 1 x 2 x 2 mesh, the same as FullyShard2DTraining.TrainParity2DMlp on
// the 2 x 2 mesh); these 6 of them cover every pair of values of any two of the three parameters.
const std::vector<Case2D> kPairwiseCases{Case2D{false, false, 3}, Case2D{true, true, 3},   Case2D{false, true, 16},
                                         Case2D{true, false, 16}, Case2D{false, true, 17}, Case2D{true, false, 17}};

// test_2d_mlp_with_nd_mesh at world size 4, the seed's mesh there: (pp, dp, tp) = 1 x 2 x 2.
TEST(FullyShardNDTraining, TwoDMlpWithNdMesh) {
  run_ranks(4, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {1, 2, 2}, {"pp", "dp", "tp"});
    const int r = ctx.rank;
    ASSERT_EQ(mesh.ndim(), 3);
    EXPECT_EQ(mesh.shape(), (std::vector<int64_t>{1, 2, 2}));
    EXPECT_EQ(mesh.get_coordinate(), (std::vector<int>{0, r / 2, r % 2}));
    expect_sub_mesh(mesh, "pp", {r}, r);
    expect_sub_mesh(mesh, "dp", {r % 2, r % 2 + 2}, r);
    expect_sub_mesh(mesh, "tp", {r / 2 * 2, r / 2 * 2 + 1}, r);
    if (::testing::Test::HasFailure()) return;
    for (const Case2D& c : kPairwiseCases) {
      check_2d_mlp_with_nd_mesh(mesh, c);
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// The seed's pp dimension at size 2 with FSDP sharding over 2 ranks, at world size 4:
// (pp, dp, tp) = 2 x 2 x 1. Each pp slice ({0, 1} and {2, 3}) trains its own 2-D model, its
// collectives confined to its own dp and tp groups.
TEST(FullyShardNDTraining, TwoDMlpWithNdMesh2x2x1) {
  run_ranks(4, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2, 1}, {"pp", "dp", "tp"});
    const int r = ctx.rank;
    EXPECT_EQ(mesh.get_coordinate(), (std::vector<int>{r / 2, r % 2, 0}));
    expect_sub_mesh(mesh, "pp", {r % 2, r % 2 + 2}, r);
    expect_sub_mesh(mesh, "dp", {r / 2 * 2, r / 2 * 2 + 1}, r);
    expect_sub_mesh(mesh, "tp", {r}, r);
    if (::testing::Test::HasFailure()) return;
    check_2d_mlp_with_nd_mesh(mesh, {true, false, 17});
  });
}

// The seed's mesh at 8 GPUs, (pp, dp, tp) = 2 x 2 x 2: FSDP over 2 ranks and TP over 2 in each
// pp slice ({0..3} and {4..7}).
TEST(FullyShardNDTraining, TwoDMlpWithNdMesh2x2x2) {
  run_ranks(8, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2, 2}, {"pp", "dp", "tp"});
    const int r = ctx.rank;
    EXPECT_EQ(mesh.get_coordinate(), (std::vector<int>{r / 4, r / 2 % 2, r % 2}));
    expect_sub_mesh(mesh, "pp", {r % 4, r % 4 + 4}, r);
    expect_sub_mesh(mesh, "dp", {r / 4 * 4 + r % 2, r / 4 * 4 + r % 2 + 2}, r);
    expect_sub_mesh(mesh, "tp", {r / 2 * 2, r / 2 * 2 + 1}, r);
    if (::testing::Test::HasFailure()) return;
    for (const Case2D& c : kPairwiseCases) {
      check_2d_mlp_with_nd_mesh(mesh, c);
      if (::testing::Test::HasFailure()) return;
    }
  });
}

}  // namespace
}  // namespace fsdpp
