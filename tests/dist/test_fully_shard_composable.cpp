// FSDP's composable face at world sizes 1-4, ported from seed 001: fully_shard() with an
// auto-wrap policy over a transformer's blocks, shared (tied) parameters, reshard_after_forward
// as an int, a forward method other than forward, 1F1B microbatching and summon_full_params.
// References and tolerances as in test_fully_shard.cpp (single-process training on the global
// batch; float32 rtol 1.3e-6, atol 1e-5, plus 1e-4 absolute on transformer losses, whose
// softmax and layer norms sum in a different order per rank).
#include <gtest/gtest.h>

#include <functional>

#include <torch/torch.h>

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/collectives.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/error.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/wrap_policy.h>

#include "dist/fsdp_test_util.h"
#include "dist/world_sizes.h"
#include "harness/error_of.h"
#include "transformer.h"

namespace fsdpp {
namespace {

using examples::language_model_loss;
using examples::Transformer;
using examples::TransformerArgs;
using examples::TransformerBlockImpl;
using FSDPTransformer = FullyShardedDataParallel<examples::TransformerImpl>;

constexpr int64_t kSeqLen = 8;

FullyShardOptions block_policy(FullyShardOptions options) {
  return options.auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>());
}

// Random token batches of the global batch size, the same on every rank.
std::pair<at::Tensor, at::Tensor> token_batch(int64_t seed, const TransformerArgs& args) {
  torch::manual_seed(seed);
  at::Tensor tokens = torch::randint(args.vocab_size, {kGlobalBatch, kSeqLen}, torch::kLong);
  at::Tensor targets = torch::randint(args.vocab_size, {kGlobalBatch, kSeqLen}, torch::kLong);
  return {tokens, targets};
}

// Trains the plain transformer on the global batch and the sharded one on this rank's slice
// for `steps` steps; losses, gradient shards and full parameters must match every step.
// `before_sharding` (e.g. activation checkpointing) runs on the model before fully_shard.
// With `as_stages` the FSDP model is the transformer's stages (examples::transformer_stages).
void check_transformer_parity(RankContext& ctx, const TransformerArgs& args, const FullyShardOptions& options, Optim optim,
                              const std::string& label, int steps = 10,
                              const std::function<void(Transformer&)>& before_sharding = {}, bool as_stages = false) {
  const int n = ctx.world_size, rank = ctx.rank;
  torch::manual_seed(42);
  Transformer ref(args);
  torch::manual_seed(42);
  Transformer plain(args);
  if (before_sharding) before_sharding(plain);
  std::shared_ptr<torch::nn::Module> model;
  std::function<at::Tensor(const at::Tensor&)> forward;
  if (as_stages) {
    auto stages = fully_shard(examples::transformer_stages(plain), options);
    model = stages.ptr();
    forward = [stages](const at::Tensor& tokens) mutable { return stages->forward(tokens); };
  } else {
    auto whole = fully_shard(plain, options);
    model = whole.ptr();
    forward = [whole](const at::Tensor& tokens) mutable { return whole->forward(tokens); };
  }
  auto ref_params = ref->parameters();
  auto params = model->parameters();
  ASSERT_EQ(params.size(), ref_params.size()) << label;
  auto ref_opt = make_optimizer(optim, ref_params);
  auto opt = make_optimizer(optim, params);
  const int64_t local = kGlobalBatch / n;
  for (int step = 0; step < steps; ++step) {
    const std::string where = label + " " + name_of(optim) + " step " + std::to_string(step);
    ref_opt->zero_grad();
    opt->zero_grad();
    auto [tokens, targets] = token_batch(1000 + step, args);
    at::Tensor ref_loss = language_model_loss(ref->forward(tokens), targets);
    ref_loss.backward();
    at::Tensor loss = language_model_loss(forward(tokens.narrow(0, rank * local, local)),
                                          targets.narrow(0, rank * local, local));
    loss.backward();
    for (size_t i = 0; i < params.size(); ++i) {
      expect_close(params[i].grad(), shard_rows(ref_params[i].grad(), rank, n), where + " grad " + std::to_string(i));
    }
    ref_opt->step();
    opt->step();
    at::Tensor global_loss = loss.detach().clone();
    all_reduce(global_loss, ReduceOp::AVG);
    EXPECT_TRUE(at::allclose(global_loss, ref_loss.detach(), kRtol, 1e-4))
        << where << " loss " << global_loss.item<double>() << " vs " << ref_loss.item<double>();
    auto full = full_params(*model);
    for (size_t i = 0; i < full.size(); ++i) expect_close(full[i], ref_params[i].detach(), where + " param " + std::to_string(i));
    if (::testing::Test::HasFailure()) return;
  }
}

// ---------------------------------------------------------------------------------------------
// The auto-wrap policies.

class FullyShardAutoWrap : public testing::WorldSizeTest {};

// FSDP2's recipe (each TransformerBlock a unit, then the root) through one call.
TEST_P(FullyShardAutoWrap, ModuleWrapPolicyTransformerTrainParity) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    TransformerArgs args;
    for (bool reshard_after_forward : {true, false})
      for (Optim optim : {Optim::kSGD, Optim::kAdam}) {
        check_transformer_parity(ctx, args, block_policy(FullyShardOptions().reshard_after_forward(reshard_after_forward)),
                                 optim, "raf " + std::to_string(reshard_after_forward));
        if (::testing::Test::HasFailure()) return;
      }
    // The units: the root and one per block, each block's parameters in its own unit.
    auto model = fully_shard(Transformer(args), block_policy({}));
    auto units = fsdp_units(*model);
    ASSERT_EQ(units.size(), 1u + args.n_layers);
    EXPECT_EQ(units[0]->sharded_parameter_names(),
              (std::vector<std::string>{"tok_embeddings.weight", "pos_embeddings.weight", "norm.weight", "norm.bias",
                                        "output.weight"}));
    EXPECT_EQ(units[1]->sharded_parameter_names().front(), "attention_norm.weight");
    // Keys of the plain model, once the wrapper segments are dropped.
    torch::manual_seed(0);
    Transformer plain(args);
    auto names = model->named_parameters().keys();
    auto plain_names = plain->named_parameters().keys();
    ASSERT_EQ(names.size(), plain_names.size());
    for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(strip_wrapper_prefixes(names[i]), plain_names[i]);
  });
}

// torchtitan's recipe: the embeddings and [norm, output] units of their own beside the blocks
// (the transformer as stages), so the root holds no parameters through backward; at parity
// with every backward prefetch timing.
TEST_P(FullyShardAutoWrap, TransformerEndsAsUnitsTrainParity) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    TransformerArgs args;
    auto policy = ModuleWrapPolicy<examples::TransformerEmbeddingsImpl, TransformerBlockImpl, examples::TransformerHeadImpl>();
    struct Case {
      std::optional<BackwardPrefetch> timing;
      const char* label;
    };
    for (const Case& c : {Case{BackwardPrefetch::BACKWARD_PRE, "ends as units, BACKWARD_PRE"},
                          Case{BackwardPrefetch::BACKWARD_POST, "ends as units, BACKWARD_POST"},
                          Case{std::nullopt, "ends as units, no backward prefetch"}}) {
      check_transformer_parity(ctx, args, FullyShardOptions().backward_prefetch(c.timing).auto_wrap_policy(policy),
                               Optim::kAdam, c.label, 5, {}, /*as_stages=*/true);
      if (::testing::Test::HasFailure()) return;
    }
    torch::manual_seed(0);
    auto model = fully_shard(examples::transformer_stages(Transformer(args)), FullyShardOptions().auto_wrap_policy(policy));
    auto units = fsdp_units(*model);
    ASSERT_EQ(units.size(), 3u + args.n_layers);
    EXPECT_TRUE(units[0]->sharded_parameter_names().empty());
    EXPECT_EQ(units[1]->sharded_parameter_names(),
              (std::vector<std::string>{"tok_embeddings.weight", "pos_embeddings.weight"}));
    EXPECT_EQ(units.back()->sharded_parameter_names(),
              (std::vector<std::string>{"norm.weight", "norm.bias", "output.weight"}));
    args.weight_tying = true;
    EXPECT_THROW(examples::transformer_stages(Transformer(args)), c10::Error) << "tied ends cannot be two units";
  });
}

// size_based_auto_wrap_policy: Sequential elements with at least 100 parameters become units
// (of a type the policy never names), the small last Linear stays with the root.
TEST_P(FullyShardAutoWrap, SizeBasedPolicyTrainParity) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (Optim optim : {Optim::kSGD, Optim::kAdam}) {
      const auto options = FullyShardOptions().auto_wrap_policy(SizeBasedAutoWrapPolicy(100));
      torch::manual_seed(42);
      Sequential ref = make_multi_group(false, {});
      torch::manual_seed(42);
      auto model = fully_shard(make_multi_group(false, {}), options);
      auto units = fsdp_units(*model);
      ASSERT_EQ(units.size(), 3u);
      EXPECT_EQ(units[0]->sharded_parameter_names(), (std::vector<std::string>{"4.weight", "4.bias"}));
      EXPECT_EQ(units[1]->sharded_parameter_names(), (std::vector<std::string>{"weight", "bias"}));
      check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *model,
                         [&](const at::Tensor& x) { return model->forward(x); }, 7, 3, ParityCase{optim}, "size policy");
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// A custom AutoWrapPolicy as docs/api.md writes one: Linears holding at least 200 parameters
// (only the 15x15 one of the three) become units; the others stay with the root.
TEST_P(FullyShardAutoWrap, CustomPolicyAsDocumented) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto big_linears = std::make_shared<AutoWrapPolicy>();
    big_linears->should_wrap = [](const torch::nn::Module& m, int64_t numel) {
      return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr && numel >= 200;
    };
    torch::manual_seed(42);
    Sequential ref = make_multi_group(false, {});
    torch::manual_seed(42);
    auto model = fully_shard(make_multi_group(false, {}), FullyShardOptions().auto_wrap_policy(big_linears));
    auto units = fsdp_units(*model);
    ASSERT_EQ(units.size(), 2u);
    EXPECT_EQ(units[0]->sharded_parameter_names(), (std::vector<std::string>{"0.weight", "0.bias", "4.weight", "4.bias"}));
    EXPECT_EQ(units[1]->sharded_parameter_names(), (std::vector<std::string>{"weight", "bias"}));
    check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *model,
                       [&](const at::Tensor& x) { return model->forward(x); }, 7, 3, ParityCase{Optim::kAdam},
                       "custom policy");
  });
}

// A Sequential inside a module inside a Sequential: the policy reaches the Linears at both
// depths; the root keeps no parameters of its own.
class MlpBlockImpl : public torch::nn::Module {
 public:
  MlpBlockImpl() { body = register_module("body", Sequential(Linear(5, 6), ReLU(), Linear(6, 6))); }
  at::Tensor forward(at::Tensor x) { return body->forward(x); }
  Sequential body{nullptr};
};
TORCH_MODULE(MlpBlock);

TEST_P(FullyShardAutoWrap, NestedContainersAndParamlessRoot) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto make = [] { return Sequential(MlpBlock(), ReLU(), Linear(6, 2)); };
    torch::manual_seed(7);
    Sequential ref = make();
    torch::manual_seed(7);
    auto model = fully_shard(make(), FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<torch::nn::LinearImpl>()));
    auto units = fsdp_units(*model);
    ASSERT_EQ(units.size(), 4u);  // the root and three Linears
    EXPECT_TRUE(units[0]->sharded_parameter_names().empty());
    check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *model,
                       [&](const at::Tensor& x) { return model->forward(x); }, 5, 2, ParityCase{Optim::kAdam, 5},
                       "nested");
  });
}

// ModuleList elements become typed units; the caller reaches them as such.
class ListModelImpl : public torch::nn::Module {
 public:
  ListModelImpl() {
    layers = register_module("layers", torch::nn::ModuleList(Linear(7, 15), Linear(15, 15), Linear(15, 3)));
  }
  at::Tensor forward(at::Tensor x) {
    for (size_t i = 0; i < layers->size(); ++i) {
      auto layer = layers->ptr(i);
      if (auto* unit = layer->as<FullyShardedDataParallelImpl<torch::nn::LinearImpl>>())
        x = unit->forward(x);
      else
        x = layer->as<torch::nn::LinearImpl>()->forward(x);
      if (i + 1 < layers->size()) x = torch::relu(x);
    }
    return x;
  }
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(ListModel);

TEST_P(FullyShardAutoWrap, ModuleListElementsBecomeTypedUnits) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(3);
    ListModel ref;
    torch::manual_seed(3);
    auto model = fully_shard(ListModel(), FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<torch::nn::LinearImpl>()));
    EXPECT_EQ(fsdp_units(*model).size(), 4u);
    check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *model,
                       [&](const at::Tensor& x) { return model->forward(x); }, 7, 3, ParityCase{Optim::kAdam, 5},
                       "module list");
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardAutoWrap);

// ---------------------------------------------------------------------------------------------
// TestFullyShardSharedParams: the output projection tied to the token embedding.

class FullyShardSharedParams : public testing::WorldSizeTest {};

// Seed 001 test_train_parity_with_shared_params: reshard_after_forward F/T x
// use_activation_checkpointing F/T (the seed checkpoints each block, then shards it: here
// apply_activation_checkpointing on the blocks, then a unit around each checkpoint wrapper).
TEST_P(FullyShardSharedParams, TrainParityWithSharedParams) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    TransformerArgs args;
    args.n_layers = 3;
    args.weight_tying = true;
    for (bool reshard_after_forward : {false, true})
      for (bool use_activation_checkpointing : {false, true}) {
        auto options = FullyShardOptions().reshard_after_forward(reshard_after_forward);
        if (use_activation_checkpointing)
          options.auto_wrap_policy(ModuleWrapPolicy<CheckpointWrapperImpl<TransformerBlockImpl>>());
        else
          options = block_policy(options);
        int checkpointed = 0;
        auto checkpoint_blocks = [&](Transformer& m) {
          checkpointed = apply_activation_checkpointing(*m, ModuleWrapPolicy<TransformerBlockImpl>());
          EXPECT_TRUE(m->output->weight.is_same(m->tok_embeddings->weight)) << "tie kept by checkpointing";
        };
        check_transformer_parity(ctx, args, options, Optim::kAdam,
                                 "tied raf " + std::to_string(reshard_after_forward) + " ac " +
                                     std::to_string(use_activation_checkpointing),
                                 10, use_activation_checkpointing ? std::function<void(Transformer&)>(checkpoint_blocks)
                                                                  : std::function<void(Transformer&)>());
        EXPECT_EQ(checkpointed, use_activation_checkpointing ? args.n_layers : 0);
        if (::testing::Test::HasFailure()) return;
      }
    // The tied tensor is one parameter of the root unit, listed under both names.
    auto model = fully_shard(Transformer(args), block_policy({}));
    auto root_params = fsdp_units(*model)[0]->sharded_parameter_names();
    EXPECT_EQ(std::count(root_params.begin(), root_params.end(), "tok_embeddings.weight"), 1);
    EXPECT_EQ(std::count(root_params.begin(), root_params.end(), "output.weight"), 0);
    EXPECT_TRUE(model->module()->output->weight.is_same(model->module()->tok_embeddings->weight));
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardSharedParams);

// ---------------------------------------------------------------------------------------------
// reshard_after_forward as an int (seed's test_train_parity_multi_group with 2).

class FullyShardReshardAfterForwardInt : public testing::WorldSizeTest {};

// An int means k ways and a bool means true / false; no other type converts (a long, a size_t or
// a double would otherwise reach the bool and silently mean true).
static_assert(!std::is_convertible_v<double, ReshardPolicy> && !std::is_convertible_v<int64_t, ReshardPolicy> &&
              !std::is_convertible_v<size_t, ReshardPolicy> && std::is_convertible_v<int, ReshardPolicy> &&
              std::is_convertible_v<bool, ReshardPolicy>);

// FSDPModule::set_reshard_after_forward takes a bool only, as PyTorch's.
template <typename T, typename = void>
struct accepts_set_reshard_after_forward : std::false_type {};
template <typename T>
struct accepts_set_reshard_after_forward<
    T, std::void_t<decltype(std::declval<FSDPModule&>().set_reshard_after_forward(std::declval<T>()))>> : std::true_type {};
static_assert(accepts_set_reshard_after_forward<bool>::value && !accepts_set_reshard_after_forward<int>::value);

TEST(FullyShardReshardPolicy, AnIntMeansWaysNotTrue) {
  const ReshardPolicy two = FullyShardOptions().reshard_after_forward(2).reshard_after_forward();
  EXPECT_EQ(two.to_string(), "2");
  EXPECT_EQ(two.post_forward_size(4), 2);
  EXPECT_TRUE(two.reshards());
  EXPECT_EQ(ReshardPolicy(true).post_forward_size(4), 0);
  EXPECT_EQ(ReshardPolicy(1).to_string(), "false");
  EXPECT_FALSE(ReshardPolicy(1).reshards());
  EXPECT_EQ(FullyShardOptions().reshard_after_forward().to_string(), "true");
  // Every int is checked: -1 is no stand-in for true.
  EXPECT_EQ(ReshardPolicy(-1).to_string(), "-1");
  const std::string minus_one = testing::error_of([] { ReshardPolicy(-1).check(4, "unit", "g"); });
  EXPECT_NE(minus_one.find("reshard_after_forward = -1 is not allowed"), std::string::npos) << minus_one;
}

TEST_P(FullyShardReshardAfterForwardInt, TrainParityAndCommPerStep) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    // PyTorch refuses 0 (neither a bool nor a group size), and so do we.
    std::string zero = testing::error_of([] { FSDPLinear(Linear(3, 4), FullyShardOptions().reshard_after_forward(0)); });
    EXPECT_NE(zero.find("reshard_after_forward = 0 is not allowed"), std::string::npos) << zero;
    if (n % 2 != 0) {
      // 2 does not divide an odd group: a clear error when wrapping.
      std::string error = testing::error_of([] { FSDPLinear(Linear(3, 4), FullyShardOptions().reshard_after_forward(2)); });
      EXPECT_NE(error.find("reshard_after_forward = 2 must divide the shard group's size " + std::to_string(n)),
                std::string::npos)
          << error;
      return;
    }
    const auto options = FullyShardOptions().reshard_after_forward(2);
    for (Optim optim : {Optim::kSGD, Optim::kAdam})
      for (bool delay : {false, true}) {
        torch::manual_seed(42);
        Sequential ref = make_multi_group(false, {});
        torch::manual_seed(42);
        FSDPSequential model(make_multi_group(true, options), options);
        check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *model,
                           [&](const at::Tensor& x) { return model->forward(x); }, 7, 3, ParityCase{optim}.delays(delay ? 15 : 0),
                           "raf 2 delay " + std::to_string(delay));
        if (::testing::Test::HasFailure()) return;
      }
    // Forward gathers each unit over the whole group; backward gathers the two inner units
    // again, but only within their 2-rank post-forward groups: (2-1)/2 of the unit's bytes.
    torch::manual_seed(42);
    FSDPSequential model(make_multi_group(true, options), options);
    auto units = fsdp_units(*model);
    const int64_t root = units[0]->unsharded_padded_numel();
    const int64_t inner = units[1]->unsharded_padded_numel() + units[2]->unsharded_padded_numel();
    model->forward(torch::randn({4, 7})).sum().backward();  // the first step records the order
    CommDebugMode comm;
    at::Tensor loss = model->forward(torch::randn({4, 7})).sum();
    EXPECT_EQ(comm.bytes_sent("all_gather_into_tensor"), (root + inner) * (n - 1) / n * 4);
    loss.backward();
    EXPECT_EQ(comm.count("all_gather_into_tensor"), 5);
    EXPECT_EQ(comm.bytes_sent("all_gather_into_tensor"), (root + inner) * (n - 1) / n * 4 + inner / 2 * 4);
    EXPECT_EQ(comm.bytes_sent("reduce_scatter_tensor"), (root + inner) * (n - 1) / n * 4);
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardReshardAfterForwardInt);

// ---------------------------------------------------------------------------------------------
// TestFullyShardCustomForwardMethod: the parent calls vit->forward_features, not forward.

class VisionTransformerImpl : public torch::nn::Module {
 public:
  VisionTransformerImpl() { patch_proj = register_module("patch_proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 2).stride(2))); }
  at::Tensor forward_features(at::Tensor imgs) { return patch_proj->forward(imgs).flatten(2).transpose(1, 2); }
  at::Tensor forward(at::Tensor imgs) { return forward_features(imgs).sum(1); }
  torch::nn::Conv2d patch_proj{nullptr};
};
TORCH_MODULE(VisionTransformer);

// `sharded` picks the typed members' one-line change: units instead of plain modules.
class VisionModelImpl : public torch::nn::Module {
 public:
  explicit VisionModelImpl(bool sharded) {
    torch::manual_seed(42);
    VisionTransformer v;
    torch::nn::Linear p(8, 5);
    if (sharded) {
      fsdp_vit = register_module("vit", fully_shard(v).ptr());
      fsdp_projector = register_module("projector", fully_shard(p).ptr());
    } else {
      vit = register_module("vit", v);
      projector = register_module("projector", p);
    }
  }
  at::Tensor forward(at::Tensor imgs) {
    if (fsdp_vit) return fsdp_projector->forward(fsdp_vit->forward_method(&VisionTransformerImpl::forward_features, imgs));
    return projector->forward(vit->forward_features(imgs));
  }
  VisionTransformer vit{nullptr};
  torch::nn::Linear projector{nullptr};
  std::shared_ptr<FullyShardedDataParallelImpl<VisionTransformerImpl>> fsdp_vit;
  std::shared_ptr<FullyShardedDataParallelImpl<torch::nn::LinearImpl>> fsdp_projector;
};
TORCH_MODULE(VisionModel);

class FullyShardCustomForwardMethod : public testing::WorldSizeTest {};

TEST_P(FullyShardCustomForwardMethod, RegisterFsdpForwardMethod) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    VisionModel ref(false);
    auto model = fully_shard(VisionModel(true));
    torch::manual_seed(43);
    at::Tensor inp = torch::randn({4 * n, 3, 4, 4});
    at::Tensor ref_loss = ref->forward(inp).sum() / n;
    ref_loss.backward();
    at::Tensor loss = model->forward(inp.narrow(0, 4 * rank, 4)).sum();
    at::Tensor global = loss.detach().clone();
    all_reduce(global, ReduceOp::SUM);
    EXPECT_TRUE(at::allclose(global, ref_loss.detach() * n, kRtol, 1e-4));
    loss.backward();
    auto ref_params = ref->parameters();
    auto params = model->parameters();
    ASSERT_EQ(params.size(), ref_params.size());
    // FSDP averages over ranks the gradient of each rank's sum: the reference's sum over n.
    for (size_t i = 0; i < params.size(); ++i)
      expect_close(params[i].grad(), shard_rows(ref_params[i].grad(), rank, n), "grad " + std::to_string(i));
    EXPECT_EQ(fsdp_units(*model).size(), 3u);
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardCustomForwardMethod);

// ---------------------------------------------------------------------------------------------
// TestFullyShardGradientAccumulation.test_1f1b_microbatching

TEST_P(FullyShardGradientAccumulation, OneFOneBMicrobatching) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    TransformerArgs args;
    const int num_microbatches = 3;
    for (bool use_explicit_unshard : {false, true})
      for (bool reshard_after_backward : {false, true}) {
        const std::string label = "explicit " + std::to_string(use_explicit_unshard) + " rab " +
                                  std::to_string(reshard_after_backward);
        torch::manual_seed(42);
        Transformer ref(args);
        torch::manual_seed(42);
        auto model = fully_shard(Transformer(args), block_policy(FullyShardOptions().reshard_after_forward(false)));
        torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-2));
        torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
        if (use_explicit_unshard)
          for (auto* unit : fsdp_units(*model)) unit->unshard(/*async_op=*/true);
        const int64_t local = kGlobalBatch / n;
        CommDebugMode comm;
        for (int mb = 0; mb < num_microbatches; ++mb) {
          const bool last = mb == num_microbatches - 1;
          model->set_requires_gradient_sync(last);
          model->set_is_last_backward(last);
          if (!reshard_after_backward) model->set_reshard_after_backward(last);
          auto [tokens, targets] = token_batch(500 + mb, args);
          at::Tensor loss = language_model_loss(model->forward(tokens.narrow(0, rank * local, local)),
                                                targets.narrow(0, rank * local, local));
          loss.backward();
          at::Tensor ref_loss = language_model_loss(ref->forward(tokens), targets);
          ref_loss.backward();
          at::Tensor global_loss = loss.detach().clone();
          all_reduce(global_loss, ReduceOp::AVG);
          EXPECT_TRUE(at::allclose(global_loss, ref_loss.detach(), kRtol, 1e-4)) << label << " microbatch " << mb;
          if (!last) {
            EXPECT_EQ(comm.count("reduce_scatter_tensor"), 0) << label << " microbatch " << mb;
          }
        }
        EXPECT_EQ(comm.count("reduce_scatter_tensor"), static_cast<int64_t>(fsdp_units(*model).size())) << label;
        opt.step();
        ref_opt.step();
        auto full = full_params(*model);
        auto ref_params = ref->parameters();
        for (size_t i = 0; i < full.size(); ++i) expect_close(full[i], ref_params[i].detach(), label + " param " + std::to_string(i));
        if (::testing::Test::HasFailure()) return;
      }
  });
}

// set_is_last_backward on one inner unit applies to that unit: with every other unit's flag
// off, that unit alone waits at the end of backward, so its gradient shards are written when
// backward returns (the others may still be in flight). The next forward finishes the rest, and
// every gradient then equals a run in which all units waited.
class FullyShardIsLastBackward : public testing::WorldSizeTest {};

TEST_P(FullyShardIsLastBackward, InnerUnitFlagAppliesToThatUnit) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(7 + ctx.rank);
    const at::Tensor x = torch::rand({4, 7});
    auto train = [&](bool all_wait) {
      torch::manual_seed(42);
      FSDPSequential model(make_multi_group(true, FullyShardOptions()), FullyShardOptions());
      auto* first = dynamic_cast<FSDPModule*>(model->module()->ptr(0).get());
      model->set_is_last_backward(all_wait);  // the root and every unit inside it
      first->set_is_last_backward(true);
      model->forward(x).sum().backward();
      for (const auto& p : first->parameters())
        EXPECT_TRUE(p.grad().defined()) << "the unit whose flag is on waited for its gradient";
      model->set_is_last_backward(true);
      at::NoGradGuard no_grad;
      model->forward(x);  // the root's next forward finishes what is in flight
      model->reshard();   // the root keeps its parameters gathered after forward
      std::vector<at::Tensor> grads;
      for (const auto& p : model->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
      return grads;
    };
    const auto waited = train(true), deferred = train(false);
    ASSERT_EQ(waited.size(), deferred.size());
    for (size_t i = 0; i < waited.size(); ++i) {
      ASSERT_TRUE(waited[i].defined() && deferred[i].defined()) << "parameter " << i;
      EXPECT_TRUE(at::equal(waited[i], deferred[i])) << "parameter " << i;
    }
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardIsLastBackward);

// ---------------------------------------------------------------------------------------------
// summon_full_params

class FullyShardSummonFullParams : public testing::WorldSizeTest {};

TEST_P(FullyShardSummonFullParams, WritebackKeepsEditsAndDiscardDropsThem) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(42);
    Sequential ref = make_multi_group(false, {});
    torch::manual_seed(42);
    FSDPSequential model(make_multi_group(true, FullyShardOptions()), FullyShardOptions());
    auto ref_params = ref->parameters();
    {
      auto full = summon_full_params(*model, /*writeback=*/false);
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        ASSERT_TRUE(at::equal(params[i].detach(), ref_params[i].detach())) << "inside, param " << i;
        params[i].detach().mul_(3);
      }
    }
    auto after = full_params(*model);
    for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(at::equal(after[i], ref_params[i].detach())) << "discarded " << i;
    {
      auto full = summon_full_params(*model);
      for (auto& p : model->parameters()) p.detach().mul_(2);
    }
    after = full_params(*model);
    for (size_t i = 0; i < after.size(); ++i)
      EXPECT_TRUE(at::equal(after[i], ref_params[i].detach() * 2)) << "written back " << i;
    // Training goes on from the edited values.
    model->forward(torch::randn({2, 7})).sum().backward();
    for (auto& p : model->parameters()) EXPECT_EQ(p.grad().sizes(), p.sizes());
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardSummonFullParams);

}  // namespace
}  // namespace fsdpp
