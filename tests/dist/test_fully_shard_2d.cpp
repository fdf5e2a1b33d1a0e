// 2-D parallelism, FSDP x tensor parallelism (seed 001's TestFullyShard2DTraining): the seed's
// MLPStack cut by parallelize_module over the "tp" mesh dimension, then every MLP and the root
// fully_shard over "dp". FSDP shards each TP-local part along dim 0 across dp; a parameter's
// global value is its FSDP gather (over dp) gathered again by its TP layout (over tp).
#include <map>

#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/error.h>
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
// model over the dp group (at dp = 1 the plain model, as the seed). Beyond the seed: every global
// gradient equals the reference's every step (before the step: Adam would hide a sum over dp);
// the same 2-D model without offload trains bit for bit the same (losses, shard gradients,
// parameters), the gradients are host tensors, and every global parameter is at parity with the
// reference at the end. On these CPU-only machines the compute device is the CPU, so the offload's copies are
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
    expect_global_grads_close(*model, *ref_module, where);
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

// Each entry of a SHARDED dict (a ShardedTensor, or a whole tensor) as its global value
// (full_tensor() is collective: every rank walks the keys in the same order).
std::map<std::string, at::Tensor> global_values(const StateDict& sd) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, value] : sd) out[key] = value.is_tensor() ? value.tensor() : value.sharded_tensor().full_tensor();
  return out;
}

// State dicts of a 2-D model hold the plain model's keys with global values: FULL (FSDP's gather
// over dp, then TP's over tp) and SHARDED (each rank's 2-D block as a ShardedTensor over the
// world); each loads into a fresh 2-D model, FULL into the plain model, SHARDED into a TP-only
// model (redistributed). Optimizer state dicts likewise. (LOCAL dicts: test_fully_shard_2d_local_state.cpp.)
TEST(FullyShard2DStateDict, FullAndShardedStateDictsHoldGlobalValues) {
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

    // SHARDED: the plain keys; a TP-sharded parameter is this rank's 2-D block over the group of
    // the dp x tp ranks (here the world) ([51, 17]
    // column-wise: TP rows [26 * tp, ...), then FSDP rows of those over dp); the row-wise bias
    // (replicated over tp) is FSDP's rows over dp, as any FSDP parameter.
    const StateDict sharded = get_model_state_dict(model);
    ASSERT_EQ(sharded.keys(), plain_params.keys());
    const ShardedTensor& w = sharded.at("0.in_proj.weight").sharded_tensor();
    EXPECT_EQ(w.size(), (std::vector<int64_t>{51, 17}));
    EXPECT_EQ(w.process_group().size(), 4);
    EXPECT_EQ(w.process_group().name(), default_group().name()) << "a mesh spanning the world is the default group";
    ASSERT_EQ(w.local_shards().size(), 1u);
    const int tp = mesh.get_local_rank("tp"), dp = mesh.get_local_rank("dp");
    const int64_t tp_rows = tp == 0 ? 26 : 25, dp_chunk = 13;
    const int64_t rows = dp == 0 ? dp_chunk : tp_rows - dp_chunk;
    EXPECT_EQ(w.local_shards()[0].metadata.shard_offsets, (std::vector<int64_t>{26 * tp + dp_chunk * dp, 0}));
    EXPECT_EQ(w.local_shards()[0].metadata.shard_sizes, (std::vector<int64_t>{rows, 17}));
    const ShardedTensor& out_w = sharded.at("0.out_proj.weight").sharded_tensor();  // Shard(1) over tp
    EXPECT_EQ(out_w.local_shards()[0].metadata.shard_offsets, (std::vector<int64_t>{dp == 0 ? 0 : 9, 26 * tp}));
    EXPECT_EQ(sharded.at("0.out_proj.bias").sharded_tensor().process_group().size(), 2);  // dp only
    const auto sharded_global = global_values(sharded);
    for (const auto& [key, value] : expected) EXPECT_TRUE(sharded_global.at(key).equal(value)) << key;

    // Into the plain model (FULL), and into fresh (untrained) 2-D models: global values equal.
    set_model_state_dict(plain, full);
    for (const auto& item : plain->named_parameters()) EXPECT_TRUE(item.value().equal(expected.at(item.key()))) << item.key();
    for (const StateDict* sd : {&full, &sharded}) {
      FSDPSequential fresh = make_2d(c.mlp_dim, mesh["dp"], mesh["tp"], c);
      EXPECT_FALSE(global_params(*fresh).at("0.in_proj.weight").equal(expected.at("0.in_proj.weight")));
      set_model_state_dict(fresh, *sd);
      for (const auto& [key, value] : global_params(*fresh)) EXPECT_TRUE(value.equal(expected.at(key))) << key;
    }
    // SHARDED into a TP-only model, laid out otherwise: each rank's TP part is redistributed from
    // the world's blocks. It holds its row-wise biases whole, which take whole values (as any
    // parameter nothing shards; a ShardedTensor for one is refused).
    Sequential tp_only = make_mlp_stack(c.mlp_dim);
    parallelize_module(*tp_only, mesh["tp"], mlp_stack_plan(tp_only->size()));
    const std::string whole = error_of([&] { set_model_state_dict(tp_only, sharded); });
    EXPECT_NE(whole.find("'0.out_proj.bias' is a ShardedTensor but the model holds it whole"), std::string::npos) << whole;
    StateDict to_tp_only = sharded;
    for (const auto& key : sharded.keys())
      if (key.find("out_proj.bias") != std::string::npos) to_tp_only.set(key, full.at(key));
    set_model_state_dict(tp_only, to_tp_only);
    for (const auto& [key, value] : global_params(*tp_only)) EXPECT_TRUE(value.equal(expected.at(key))) << key;
    // A TP-only model's SHARDED dict: TP parts over the tp group, replicated entries whole.
    const StateDict tp_sharded = get_model_state_dict(tp_only);
    EXPECT_EQ(tp_sharded.at("0.in_proj.weight").sharded_tensor().process_group().size(), 2);
    EXPECT_TRUE(tp_sharded.at("0.out_proj.bias").is_tensor());
    const auto tp_global = global_values(tp_sharded);
    for (const auto& [key, value] : expected) EXPECT_TRUE(tp_global.at(key).equal(value)) << key;

    // Optimizer state: SHARDED blocks hold the FULL dict's values; both load into a fresh
    // optimizer of a fresh 2-D model, which then gives the same dicts.
    const auto full_optim = flatten_optimizer_state(
        get_optimizer_state_dict(*model, opt, StateDictOptions().full_state_dict(true)));
    const OptimizerStateDict sharded_osd = get_optimizer_state_dict(*model, opt);
    const auto sharded_optim = global_values(flatten_optimizer_state(sharded_osd));
    ASSERT_EQ(sharded_optim.size(), full_optim.size());
    for (const auto& [key, value] : full_optim) EXPECT_TRUE(sharded_optim.at(key).equal(value.tensor())) << key;
    FSDPSequential fresh = make_2d(c.mlp_dim, mesh["dp"], mesh["tp"], c);
    set_model_state_dict(fresh, sharded);
    torch::optim::Adam fresh_opt(fresh->parameters(), 0.5);
    set_optimizer_state_dict(*fresh, fresh_opt, sharded_osd);
    const auto reloaded = flatten_optimizer_state(
        get_optimizer_state_dict(*fresh, fresh_opt, StateDictOptions().full_state_dict(true)));
    for (const auto& [key, value] : full_optim) EXPECT_TRUE(reloaded.at(key).tensor().equal(value.tensor())) << key;
    EXPECT_DOUBLE_EQ(fresh_opt.param_groups()[0].options().get_lr(), 1e-2);

    // A whole value of the TP-local shape (a TP model's old local state dict) is refused naming both shapes.
    StateDict local = full;
    local.set("0.in_proj.weight", torch::zeros({26, 17}));
    const std::string shape = error_of([&] { set_model_state_dict(*model, local); });
    EXPECT_NE(shape.find("size mismatch for '0.in_proj.weight'"), std::string::npos) << shape;
  });
}

}  // namespace
}  // namespace fsdpp
