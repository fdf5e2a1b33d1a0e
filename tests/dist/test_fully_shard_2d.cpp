// 2-D parallelism, FSDP x tensor parallelism (seed 001's TestFullyShard2DTraining): the seed's
// MLPStack cut by parallelize_module over the "tp" mesh dimension, then every MLP and the root
// fully_shard over "dp". FSDP shards each TP-local part along dim 0 across dp; a parameter's
// global value is its FSDP gather (over dp) gathered again by its TP layout (over tp).
#include <map>

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/error.h>
#include <fsdpp/optim_state_dict.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/tensor_parallel.h>

#include "dist/fsdp_test_util.h"
#include "harness/error_of.h"

namespace fsdpp {
namespace {

using testing::error_of;

// Float32 sums over the same values in another order (DDP's average vs FSDP's reduce-scatter,
// TP's partial sums). Measured over the whole sweep at both meshes (libtorch 1.13): max abs
// difference 4.8e-7 in the losses (values up to 4.5) and 2.1e-7 in the parameters (up to 0.61);
// the bounds leave about 4x. rtol is float32 assertEqual's default.
constexpr double kLossRtol = 1.3e-6, kLossAtol = 2e-6;
constexpr double kParamRtol = 1.3e-6, kParamAtol = 1e-6;

struct Case2D {
  bool reshard_after_forward = true;
  bool activation_checkpointing = false;
  int64_t mlp_dim = 16;
};

std::string describe(const Case2D& c) {
  return "reshard_after_forward " + std::to_string(c.reshard_after_forward) + " ac " +
         std::to_string(c.activation_checkpointing) + " mlp_dim " + std::to_string(c.mlp_dim);
}

// PyTorch's MLPStack (common_fsdp.py) without sequence parallelism: hidden sizes 3x, 4x, 3x
// (3x exercises uneven TP and FSDP shards), a relu after each Linear.
Sequential make_mlp_stack(int64_t dim) {
  torch::manual_seed(42);
  return Sequential(MLP(dim, 3 * dim, true), MLP(dim, 4 * dim, true), MLP(dim, 3 * dim, true));
}

// MLPStack.parallelize: in_proj column-wise and out_proj row-wise over tp, then each MLP
// (checkpointed first when asked) and the root fully_shard over dp.
ParallelizePlan mlp_stack_plan(size_t mlps) {
  ParallelizePlan plan;
  for (size_t i = 0; i < mlps; ++i) {
    plan.emplace_back(std::to_string(i) + ".in_proj", ColwiseParallel());
    plan.emplace_back(std::to_string(i) + ".out_proj", RowwiseParallel());
  }
  return plan;
}

FSDPSequential make_2d(int64_t dim, const DeviceMesh& mesh, const Case2D& c) {
  Sequential stack = make_mlp_stack(dim);
  parallelize_module(*stack, mesh["tp"], mlp_stack_plan(stack->size()));
  const auto options = FullyShardOptions().mesh(mesh["dp"]).reshard_after_forward(c.reshard_after_forward);
  Sequential seq;
  for (size_t i = 0; i < stack->size(); ++i) {
    auto mlp = stack->ptr<MLPImpl>(i);
    if (c.activation_checkpointing)
      seq->push_back(fully_shard(checkpoint_wrapper(mlp), options));
    else
      seq->push_back(fully_shard(mlp, options));
  }
  return FSDPSequential(seq, options);
}

// Every parameter's global value: gathered over dp by FSDP (summon_full_params), then over tp by
// its TP layout. Keys are the plain model's.
std::map<std::string, at::Tensor> global_params(torch::nn::Module& model) {
  std::map<const c10::TensorImpl*, TensorLayout> tp_layouts;
  for (const auto& p : tensor_parallel_parameters(model)) tp_layouts.emplace(p.param.unsafeGetTensorImpl(), p.layout);
  std::map<std::string, at::Tensor> out;
  auto full = summon_full_params(model, /*writeback=*/false);
  for (const auto& item : model.named_parameters()) {
    std::string key = strip_wrapper_prefixes(item.key());
    for (size_t pos; (pos = key.find("_checkpoint_wrapped_module.")) != std::string::npos;) key.erase(pos, 27);
    at::Tensor local_full = item.value().detach().clone();
    auto it = tp_layouts.find(item.value().unsafeGetTensorImpl());
    out[key] = it == tp_layouts.end() ? local_full
                                      : it->second.to_sharded_tensor(local_full.contiguous(), /*copy=*/true).full_tensor();
  }
  return out;
}

void expect_same(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol,
                 const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::allclose(actual, expected, rtol, atol))
      << what << ": max abs diff " << (actual - expected).abs().max().item<double>();
}

// The seed's loop: DDP over the dp group (the reference, the plain model) and the 2-D model on the
// same input on every tp rank of a dp rank, Adam(1e-2), 10 steps, zero_grad alternating
// set_to_none. Losses every step, every global parameter at the end.
void check_2d_parity(RankContext& ctx, const DeviceMesh& mesh, const Case2D& c) {
  const std::string label = describe(c);
  Sequential ref_module = make_mlp_stack(c.mlp_dim);
  auto ref = replicate(ref_module, DistributedDataParallelOptions().process_group(mesh.get_group("dp")));
  FSDPSequential model = make_2d(c.mlp_dim, mesh, c);
  torch::optim::Adam ref_opt(ref_module->parameters(), 1e-2), opt(model->parameters(), 1e-2);
  torch::manual_seed(42 + mesh.get_local_rank("dp") + 1);
  for (int iter = 0; iter < 10; ++iter) {
    for (auto* o : std::initializer_list<torch::optim::Optimizer*>{&ref_opt, &opt}) {
      if (iter % 2 == 0) {
        for (auto& p : o->parameters()) p.mutable_grad().reset();
      } else {
        o->zero_grad();
      }
    }
    at::Tensor x = torch::randn({8, c.mlp_dim});
    at::Tensor ref_loss = ref.forward(x).sum();
    ref_loss.backward();
    ref_opt.step();
    at::Tensor loss = model->forward(x).sum();
    loss.backward();
    opt.step();
    expect_same(loss.detach(), ref_loss.detach(), kLossRtol, kLossAtol, label + " iter " + std::to_string(iter) + " loss");
    if (::testing::Test::HasFailure()) return;
  }
  const auto global = global_params(*model);
  const auto ref_named = ref_module->named_parameters();
  ASSERT_EQ(global.size(), ref_named.size()) << label;
  for (const auto& item : ref_named) {
    auto it = global.find(item.key());
    ASSERT_TRUE(it != global.end()) << label << ": no parameter " << item.key();
    expect_same(it->second, item.value().detach(), kParamRtol, kParamAtol, label + " param " + item.key());
  }
}

void run_seed_sweep(RankContext& ctx, int dp, int tp) {
  const DeviceMesh mesh = init_device_mesh(ctx.world, {dp, tp}, {"dp", "tp"});
  for (bool raf : {false, true})
    for (bool ac : {false, true})
      for (int64_t dim : {3, 16, 17}) {
        check_2d_parity(ctx, mesh, {raf, ac, dim});
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
// model (redistributed). Optimizer state dicts likewise. LOCAL dicts are refused.
TEST(FullyShard2DStateDict, FullAndShardedStateDictsHoldGlobalValues) {
  run_ranks(4, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
    const Case2D c{true, false, 17};
    FSDPSequential model = make_2d(c.mlp_dim, mesh, c);
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

    // SHARDED: the plain keys; a TP-sharded parameter is this rank's 2-D block ([51, 17]
    // column-wise: TP rows [26 * tp, ...), then FSDP rows of those over dp); the row-wise bias
    // (replicated over tp) is FSDP's rows over dp, as any FSDP parameter.
    const StateDict sharded = get_model_state_dict(model);
    ASSERT_EQ(sharded.keys(), plain_params.keys());
    const ShardedTensor& w = sharded.at("0.in_proj.weight").sharded_tensor();
    EXPECT_EQ(w.size(), (std::vector<int64_t>{51, 17}));
    EXPECT_EQ(w.process_group().size(), 4);
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
      FSDPSequential fresh = make_2d(c.mlp_dim, mesh, c);
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
    FSDPSequential fresh = make_2d(c.mlp_dim, mesh, c);
    set_model_state_dict(fresh, sharded);
    torch::optim::Adam fresh_opt(fresh->parameters(), 0.5);
    set_optimizer_state_dict(*fresh, fresh_opt, sharded_osd);
    const auto reloaded = flatten_optimizer_state(
        get_optimizer_state_dict(*fresh, fresh_opt, StateDictOptions().full_state_dict(true)));
    for (const auto& [key, value] : full_optim) EXPECT_TRUE(reloaded.at(key).tensor().equal(value.tensor())) << key;
    EXPECT_DOUBLE_EQ(fresh_opt.param_groups()[0].options().get_lr(), 1e-2);

    // Refused: a LOCAL load (flat FSDP shards of TP parts).
    {
      auto scope = state_dict_type(*model, StateDictType::LOCAL_STATE_DICT);
      const std::string local = error_of([&] { load_state_dict(*model, full); });
      EXPECT_NE(local.find("'0.in_proj.weight' is tensor-parallel (global shape [51, 17], Shard(0) over the TP group of "
                           "2 ranks, then FSDP-sharded: 2-D)"),
                std::string::npos)
          << local;
      EXPECT_NE(local.find("LOCAL_STATE_DICT of tensor-parallel models: not supported yet"), std::string::npos) << local;
    }
    // A whole value of the TP-local shape (a TP model's old local state dict) is refused naming both shapes.
    StateDict local = full;
    local.set("0.in_proj.weight", torch::zeros({26, 17}));
    const std::string shape = error_of([&] { set_model_state_dict(*model, local); });
    EXPECT_NE(shape.find("size mismatch for '0.in_proj.weight'"), std::string::npos) << shape;
  });
}

}  // namespace
}  // namespace fsdpp
