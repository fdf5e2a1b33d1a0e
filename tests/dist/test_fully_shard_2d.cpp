// 2-D parallelism, FSDP x tensor parallelism (seed 001's TestFullyShard2DTraining): the seed's
// MLPStack cut by parallelize_module over the "tp" mesh dimension, then every MLP and the root
// fully_shard over "dp". FSDP shards each TP-local part along dim 0 across dp; a parameter's
// global value is its FSDP gather (over dp) gathered again by its TP layout (over tp).
#include <map>

#include <fsdpp/clip_grad_norm.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/error.h>
#include <fsdpp/optim_state_dict.h>
#include <fsdpp/state_dict.h>

#include "dist/fully_shard_2d_fixtures.h"
#include "harness/error_of.h"

namespace fsdpp {
namespace {

using testing::error_of;

void run_seed_sweep(RankContext& ctx, int dp, int tp) {
  const DeviceMesh mesh = init_device_mesh(ctx.world, {dp, tp}, {"dp", "tp"});
  for (bool raf : {false, true})
    for (bool ac : {false, true})
      for (int64_t dim : {3, 16, 17}) {
        check_2d_parity(mesh["dp"], mesh["tp"], {raf, ac, dim});
        if (::testing::Test::HasFailure()) return;
      }
}

// test_train_parity_2d_mlp at world size 4: (dp, tp) = 2 x 2.
TEST(FullyShard2DTraining, TrainParity2DMlp) {
  run_ranks(4, [](RankContext& ctx) { run_seed_sweep(ctx, 2, 2); });
}

// The seed's mesh at world size 2: (dp, tp) = 1 x 2.
TEST(FullyShard2DTraining, TrainParity2DMlp1x2) {
  run_ranks(2, [](RankContext& ctx) { run_seed_sweep(ctx, 1, 2); });
}

// A parameter's gradient against the same parameter's in a twin model, bit for bit.
void expect_same_grads(torch::nn::Module& model, torch::nn::Module& twin, const std::string& label) {
  const auto params = model.named_parameters(), twin_params = twin.named_parameters();
  ASSERT_EQ(params.size(), twin_params.size()) << label;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i].value();
    ASSERT_TRUE(p.grad().defined()) << label << " " << params[i].key();
    EXPECT_TRUE(p.grad().device().is_cpu()) << label << " " << params[i].key();
    EXPECT_EQ(p.grad().sizes(), p.sizes()) << label << " " << params[i].key() << ": the gradient is shard-shaped";
    EXPECT_TRUE(p.grad().equal(twin_params[i].value().grad())) << label << " " << params[i].key();
  }
}

// Seed 001 test_tp_with_fsdp_offloading: MLPStack(16) parallelized over tp, then fully_shard over
// dp with CPUOffloadPolicy and reshard_after_forward, Adam(1e-2), 10 steps on one fixed input
// (the same on every tp rank of a dp rank; the seed's dp is 1). As the seed: the parameters are
// host tensors; forward issues one TP all_reduce (row-wise out_proj) and one FSDP all-gather per
// MLP and nothing else; backward one all-gather (resharded after forward) and one reduce-scatter
// per MLP and an all_reduce of each column-wise input's gradient but the first MLP's (its input
// needs no grad); the loss equals the reference's every step. The reference is DDP of the plain
// model over the dp group (at dp = 1 the plain model, as the seed). Beyond the seed: the same
// 2-D model without offload trains bit for bit the same (losses, shard gradients, parameters),
// the gradients are host tensors, and every global parameter is at parity with the reference at
// the end. On these CPU-only machines the compute device is the CPU, so the offload's copies are
// the identity (as in FullyShardCPUOffload).
void check_tp_with_fsdp_offloading(const DeviceMesh& mesh) {
  const DeviceMesh dp_mesh = mesh["dp"], tp_mesh = mesh["tp"];
  const std::string label = "(dp, tp) = " + std::to_string(dp_mesh.size()) + " x " + std::to_string(tp_mesh.size());
  constexpr int64_t kDim = 16;
  Sequential ref_module = make_mlp_stack(kDim);
  auto ref = replicate(ref_module, DistributedDataParallelOptions().process_group(dp_mesh.get_group()));
  FSDPSequential model = make_2d(kDim, dp_mesh, tp_mesh, {true, false, kDim, /*cpu_offload=*/true});
  FSDPSequential twin = make_2d(kDim, dp_mesh, tp_mesh, {true, false, kDim, /*cpu_offload=*/false});
  for (const auto& p : model->named_parameters()) EXPECT_TRUE(p.value().device().is_cpu()) << p.key();
  int64_t num_mlps = 0;
  for (const auto& m : model->modules()) num_mlps += dynamic_cast<MLPImpl*>(m.get()) != nullptr;
  ASSERT_EQ(num_mlps, 3);
  torch::optim::Adam ref_opt(ref_module->parameters(), 1e-2), opt(model->parameters(), 1e-2),
      twin_opt(twin->parameters(), 1e-2);
  torch::manual_seed(42 + dp_mesh.get_local_rank(0) + 1);
  const at::Tensor x = torch::randn({4, kDim});
  using Counts = std::map<std::string, int64_t>;
  for (int iter = 0; iter < 10; ++iter) {
    const std::string where = label + " iter " + std::to_string(iter);
    for (auto* o : std::initializer_list<torch::optim::Optimizer*>{&ref_opt, &opt, &twin_opt}) o->zero_grad();
    at::Tensor loss;
    {
      CommDebugMode fwd;
      loss = model->forward(x).sum();
      EXPECT_EQ(fwd.get_comm_counts(), (Counts{{"all_gather_into_tensor", num_mlps}, {"all_reduce", num_mlps}}))
          << where << " forward";
    }
    at::Tensor ref_loss = ref.forward(x).sum();
    expect_same(loss.detach(), ref_loss.detach(), kLossRtol, kLossAtol, where + " loss");
    {
      CommDebugMode bwd;
      loss.backward();
      EXPECT_EQ(bwd.get_comm_counts(), (Counts{{"all_gather_into_tensor", num_mlps},
                                               {"all_reduce", num_mlps - 1},
                                               {"reduce_scatter_tensor", num_mlps}}))
          << where << " backward";
    }
    ref_loss.backward();
    at::Tensor twin_loss = twin->forward(x).sum();
    twin_loss.backward();
    EXPECT_TRUE(loss.equal(twin_loss)) << where << ": " << loss.item<double>() << " vs " << twin_loss.item<double>()
                                       << " without offload";
    expect_same_grads(*model, *twin, where);
    opt.step();
    ref_opt.step();
    twin_opt.step();
    if (::testing::Test::HasFailure()) return;
  }
  for (const auto& p : model->named_parameters()) EXPECT_TRUE(p.value().device().is_cpu()) << p.key();
  const auto global = global_params(*model), twin_global = global_params(*twin);
  for (const auto& [key, value] : global) EXPECT_TRUE(value.equal(twin_global.at(key))) << label << " " << key;
  expect_global_params_close(*model, *ref_module, label);
}

// test_tp_with_fsdp_offloading at world size 4: the seed's mesh (dp, tp) = 1 x 4, then 2 x 2.
TEST(FullyShard2DTraining, TpWithFsdpOffloading) {
  run_ranks(4, [](RankContext& ctx) {
    check_tp_with_fsdp_offloading(init_device_mesh(ctx.world, {1, 4}, {"dp", "tp"}));
    if (::testing::Test::HasFailure()) return;
    check_tp_with_fsdp_offloading(init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"}));
  });
}

// The seed's mesh at world size 2: (dp, tp) = 1 x 2.
TEST(FullyShard2DTraining, TpWithFsdpOffloading1x2) {
  run_ranks(2, [](RankContext& ctx) { check_tp_with_fsdp_offloading(init_device_mesh(ctx.world, {1, 2}, {"dp", "tp"})); });
}

// State dicts of a 2-D model: FULL holds the plain model's keys with global values (FSDP's gather
// over dp, then TP's over tp) and loads back into a fresh 2-D model and into the plain model;
// what is not supported yet (SHARDED, optimizer state) is an error naming the key.
TEST(FullyShard2DStateDict, FullStateDictHoldsGlobalValuesAndShardedIsRefused) {
  run_ranks(4, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
    const Case2D c{true, false, 17};
    FSDPSequential model = make_2d(c.mlp_dim, mesh["dp"], mesh["tp"], c);
    torch::optim::Adam opt(model->parameters(), 1e-2);
    torch::manual_seed(7 + mesh.get_local_rank("dp"));
    for (int step = 0; step < 2; ++step) {  // values no rank had at initialization
      opt.zero_grad();
      model->forward(torch::randn({4, c.mlp_dim})).sum().backward();
      opt.step();
    }
    const auto expected = global_params(*model);
    const StateDict full = get_model_state_dict(model, StateDictOptions().full_state_dict(true));
    Sequential plain = make_mlp_stack(c.mlp_dim);
    const auto plain_params = plain->named_parameters();
    ASSERT_EQ(full.keys(), plain_params.keys());
    for (const auto& [key, value] : full) {
      ASSERT_TRUE(value.is_tensor()) << key;
      EXPECT_TRUE(value.tensor().equal(expected.at(key))) << key;
    }
    // rank0_only (cpu_offload): every rank still takes part in both gathers.
    const StateDict rank0 = get_model_state_dict(model, StateDictOptions().full_state_dict(true).cpu_offload(true));
    EXPECT_EQ(rank0.size(), ctx.rank == 0 ? full.size() : 0u);
    for (const auto& [key, value] : rank0) EXPECT_TRUE(value.tensor().equal(expected.at(key))) << key;

    // Into the plain model, and into a fresh (untrained) 2-D model: global values equal the dict's.
    set_model_state_dict(plain, full);
    for (const auto& item : plain->named_parameters()) EXPECT_TRUE(item.value().equal(expected.at(item.key()))) << item.key();
    FSDPSequential fresh = make_2d(c.mlp_dim, mesh["dp"], mesh["tp"], c);
    EXPECT_FALSE(global_params(*fresh).at("0.in_proj.weight").equal(expected.at("0.in_proj.weight")));
    set_model_state_dict(fresh, full);
    for (const auto& [key, value] : global_params(*fresh)) EXPECT_TRUE(value.equal(expected.at(key))) << key;

    // Not yet: SHARDED (the default) and optimizer state dicts; errors name the first TP key.
    const std::string sharded = error_of([&] { get_model_state_dict(model); });
    EXPECT_NE(sharded.find("'0.in_proj.weight' is tensor-parallel (global shape [51, 17], Shard(0) over the TP group of "
                           "2 ranks, then FSDP-sharded: 2-D)"),
              std::string::npos)
        << sharded;
    EXPECT_NE(sharded.find("SHARDED_STATE_DICT of tensor-parallel models: not supported yet"), std::string::npos)
        << sharded;
    const std::string optim = error_of([&] { get_optimizer_state_dict(*model, opt); });
    EXPECT_NE(optim.find("get_optimizer_state_dict: '0.in_proj.weight' is tensor-parallel"), std::string::npos) << optim;
    // A LOCAL load and clipping (a TP-local norm per rank would scale TP ranks apart) are refused too.
    {
      auto scope = state_dict_type(*model, StateDictType::LOCAL_STATE_DICT);
      const std::string local = error_of([&] { load_state_dict(*model, full); });
      EXPECT_NE(local.find("'0.in_proj.weight' is tensor-parallel"), std::string::npos) << local;
      EXPECT_NE(local.find("LOCAL_STATE_DICT of tensor-parallel models: not supported yet"), std::string::npos) << local;
    }
    const std::string clip = error_of([&] { clip_grad_norm_(*model, 1.0); });
    EXPECT_NE(clip.find("in_proj"), std::string::npos) << clip;
    EXPECT_NE(clip.find("is tensor-parallel; clipping tensor-parallel (and 2-D FSDP x TP) models is not supported yet"),
              std::string::npos)
        << clip;
    // A whole value of the TP-local shape (a TP model's old local state dict) is refused naming both shapes.
    StateDict local = full;
    local.set("0.in_proj.weight", torch::zeros({26, 17}));
    const std::string shape = error_of([&] { set_model_state_dict(fresh, local); });
    EXPECT_NE(shape.find("size mismatch for '0.in_proj.weight'"), std::string::npos) << shape;

    // A TP model without FSDP: its FULL dict holds the global values too (here the initial ones).
    Sequential tp_only = make_mlp_stack(c.mlp_dim);
    parallelize_module(*tp_only, mesh["tp"], mlp_stack_plan(tp_only->size()));
    const StateDict tp_full = get_model_state_dict(tp_only, StateDictOptions().full_state_dict(true));
    const Sequential initial = make_mlp_stack(c.mlp_dim);
    ASSERT_EQ(tp_full.keys(), initial->named_parameters().keys());
    for (const auto& item : initial->named_parameters())
      EXPECT_TRUE(tp_full.at(item.key()).tensor().equal(item.value())) << item.key();
    const std::string tp_sharded = error_of([&] { get_model_state_dict(tp_only); });
    EXPECT_NE(tp_sharded.find("'0.in_proj.weight' is tensor-parallel (global shape [51, 17], Shard(0) over the TP "
                              "group of 2 ranks); SHARDED_STATE_DICT"),
              std::string::npos)
        << tp_sharded;
  });
}

}  // namespace
}  // namespace fsdpp
