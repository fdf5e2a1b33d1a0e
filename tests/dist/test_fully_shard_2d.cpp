// 2-D parallelism, FSDP x tensor parallelism (seed 001's TestFullyShard2DTraining): the seed's
// MLPStack cut by parallelize_module over the "tp" mesh dimension, then every MLP and the root
// fully_shard over "dp". FSDP shards each TP-local part along dim 0 across dp; a parameter's
// global value is its FSDP gather (over dp) gathered again by its TP layout (over tp).
#include <map>

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/clip_grad_norm.h>
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

// State dicts of a 2-D model: FULL holds the plain model's keys with global values (FSDP's gather
// over dp, then TP's over tp) and loads back into a fresh 2-D model and into the plain model;
// what is not supported yet (SHARDED, optimizer state) is an error naming the key.
TEST(FullyShard2DStateDict, FullStateDictHoldsGlobalValuesAndShardedIsRefused) {
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

    // Into the plain model, and into a fresh (untrained) 2-D model: global values equal the dict's.
    set_model_state_dict(plain, full);
    for (const auto& item : plain->named_parameters()) EXPECT_TRUE(item.value().equal(expected.at(item.key()))) << item.key();
    FSDPSequential fresh = make_2d(c.mlp_dim, mesh, c);
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
