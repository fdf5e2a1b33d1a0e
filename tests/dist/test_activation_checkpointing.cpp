// Activation checkpointing (checkpoint_wrapper, apply_activation_checkpointing): bitwise the
// plain module's outputs and gradients (dropout included), activations dropped after forward,
// composed with FSDP in both orders the seeds use (seed 001's
// test_train_parity_with_activation_checkpointing; seed 000's nested model with checkpoint
// wrappers inside and around units; applied after wrapping, units checkpointing the modules
// they wrap), and state dicts without the wrapper's segment that load
// across wrapped and unwrapped models (seed 000's test_fsdp_state_dict_with_activation_checkpoint
// and test_state_dict_with_manual_ac_wrapper, each a test of its own name).
#include <functional>
#include <optional>

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/error.h>
#include <fsdpp/memory.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/tensor_parallel.h>
#include <fsdpp/wrap_policy.h>

#include "dist/fsdp_test_util.h"
#include "transformer.h"

namespace fsdpp {
namespace {

using examples::Transformer;
using examples::TransformerArgs;
using examples::TransformerBlockImpl;

// Two modules built from the same seed.
template <typename Make>
auto twins(Make make) {
  torch::manual_seed(0);
  auto a = make();
  torch::manual_seed(0);
  auto b = make();
  return std::make_pair(a, b);
}

void expect_same_grads(torch::nn::Module& a, torch::nn::Module& b, const std::string& what) {
  auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size()) << what;
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pa[i].grad().defined()) << what << " param " << i << " got no gradient";
    EXPECT_TRUE(at::equal(pa[i].grad(), pb[i].grad())) << what << " param " << i;
  }
}

TEST(ActivationCheckpoint, MatchesThePlainModuleBitwise) {
  auto [plain, inner] = twins([] { return make_mlp({{6, 16}, {16, 4}}); });
  auto wrapped = checkpoint_wrapper(inner);
  at::Tensor x = torch::randn({5, 6}, torch::requires_grad());
  at::Tensor x2 = x.detach().clone().requires_grad_(true);
  at::Tensor y = plain->forward(x), y2 = wrapped->forward(x2);
  EXPECT_TRUE(at::equal(y, y2));
  y.pow(2).sum().backward();
  y2.pow(2).sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), x2.grad())) << "input gradient";
  expect_same_grads(*plain, *wrapped, "mlp");
}

// Dropout: the recomputation draws the same mask (the forward's RNG state is restored), and the
// caller's generator continues as if no recomputation happened.
struct DropoutMlpImpl : torch::nn::Module {
  DropoutMlpImpl() : fc1(register_module("fc1", Linear(6, 32))), fc2(register_module("fc2", Linear(32, 3))) {}
  at::Tensor forward(at::Tensor x) { return fc2(torch::dropout(torch::relu(fc1(x)), 0.5, /*train=*/true)); }
  Linear fc1, fc2;
};
TORCH_MODULE(DropoutMlp);

TEST(ActivationCheckpoint, DropoutRecomputesTheSameMask) {
  auto [plain, inner] = twins([] { return DropoutMlp(); });
  auto wrapped = checkpoint_wrapper(inner);
  at::Tensor x = torch::randn({8, 6});
  torch::manual_seed(7);
  plain->forward(x).sum().backward();
  const at::Tensor after_plain = torch::rand({4});
  torch::manual_seed(7);
  wrapped->forward(x).sum().backward();
  const at::Tensor after_wrapped = torch::rand({4});
  expect_same_grads(*plain, *wrapped, "dropout");
  EXPECT_TRUE(at::equal(after_plain, after_wrapped)) << "the caller's RNG stream is unchanged by the recomputation";
}

// Token ids as the only tensor input (nothing requires grad going in): the parameters still get
// their gradients (reentrant checkpointing's hole, closed).
struct TokensToLogitsImpl : torch::nn::Module {
  TokensToLogitsImpl()
      : embedding(register_module("embedding", torch::nn::Embedding(20, 8))), head(register_module("head", Linear(8, 20))) {}
  at::Tensor forward(at::Tensor tokens) { return head(embedding(tokens)); }
  torch::nn::Embedding embedding;
  Linear head;
};
TORCH_MODULE(TokensToLogits);

TEST(ActivationCheckpoint, TokenInputsStillGiveParameterGradients) {
  auto [plain, inner] = twins([] { return TokensToLogits(); });
  auto wrapped = checkpoint_wrapper(inner);
  at::Tensor tokens = torch::randint(20, {3, 5});
  plain->forward(tokens).logsumexp(-1).sum().backward();
  wrapped->forward(tokens).logsumexp(-1).sum().backward();
  expect_same_grads(*plain, *wrapped, "tokens");
}

// A forward taking a tensor and a number and returning a tuple; an output whose gradient is
// undefined (unused) is fine.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() : a(register_module("a", Linear(4, 3))), b(register_module("b", Linear(4, 2))) {}
  std::tuple<at::Tensor, at::Tensor> forward(at::Tensor x, double scale) { return {a(x) * scale, b(x)}; }
  Linear a, b;
};
TORCH_MODULE(TwoHeads);

TEST(ActivationCheckpoint, TupleOutputsAndNonTensorArguments) {
  auto [plain, inner] = twins([] { return TwoHeads(); });
  auto wrapped = checkpoint_wrapper(inner);
  at::Tensor x = torch::randn({5, 4});
  auto [p1, p2] = plain->forward(x, 0.5);
  auto [w1, w2] = wrapped->forward(x, 0.5);
  EXPECT_TRUE(at::equal(p1, w1));
  EXPECT_TRUE(at::equal(p2, w2));
  p1.sum().backward();
  w1.sum().backward();
  EXPECT_TRUE(at::equal(plain->a->weight.grad(), wrapped->module()->a->weight.grad()));
  EXPECT_FALSE(wrapped->module()->b->weight.grad().defined()) << "b's output got no gradient";
}

// Three Linear(128, 128) + ReLU layers.
struct ThreeLayersImpl : torch::nn::Module {
  ThreeLayersImpl() : layers(register_module("layers", Sequential(Linear(128, 128), ReLU(), Linear(128, 128), ReLU(),
                                                                   Linear(128, 128), ReLU()))) {}
  at::Tensor forward(at::Tensor x) { return layers->forward(x); }
  Sequential layers;
};
TORCH_MODULE(ThreeLayers);

// Activations held between forward and backward: a 12-layer MLP keeps every layer's input
// without checkpointing, only the wrapped blocks' inputs with it.
TEST(ActivationCheckpoint, HoldsLessAfterForward) {
  auto make = [](bool ac) {
    torch::manual_seed(0);
    Sequential net;
    for (int i = 0; i < 4; ++i) {
      if (ac)
        net->push_back(checkpoint_wrapper(ThreeLayers()));
      else
        net->push_back(ThreeLayers());
    }
    return net;
  };
  at::Tensor x = torch::randn({256, 128});
  auto held = [&](Sequential net) {
    const int64_t base = memory_stats().current_bytes;
    at::Tensor loss = net->forward(x).sum();
    const int64_t bytes = memory_stats().current_bytes - base;
    loss.backward();
    return bytes;
  };
  const int64_t without = held(make(false)), with = held(make(true));
  std::cerr << "held after forward: " << without << " bytes without checkpointing, " << with << " with ("
            << static_cast<double>(with) / without << "x)\n";
  EXPECT_LT(with * 3, without) << "12 layers' activations vs the 4 block inputs";
}

TEST(ActivationCheckpoint, ApplyWithThePoliciesOfAutoWrap) {
  auto make = [] { return make_multi_group(false, {}); };
  for (int which = 0; which < 2; ++which) {
    auto [plain, model] = twins(make);
    const int wrapped = which == 0 ? apply_activation_checkpointing(*model, ModuleWrapPolicy<torch::nn::LinearImpl>())
                                   : apply_activation_checkpointing(*model, SizeBasedAutoWrapPolicy(100));
    EXPECT_EQ(wrapped, which == 0 ? 3 : 2) << "size-based: Linear(7, 15) has 120, Linear(15, 15) 240, Linear(15, 3) 48";
    at::Tensor x = torch::randn({6, 7});
    EXPECT_TRUE(at::equal(plain->forward(x), model->forward(x)));
    plain->forward(x).sum().backward();
    model->forward(x).sum().backward();
    expect_same_grads(*plain, *model, which == 0 ? "typed" : "type-blind");
    EXPECT_EQ(state_dict(*model).keys(), state_dict(*plain).keys());
    EXPECT_EQ(apply_activation_checkpointing(*model, ModuleWrapPolicy<torch::nn::LinearImpl>()), which == 0 ? 0 : 1)
        << "wrappers are not wrapped again";
  }
}

// A type-blind wrapper of an element whose forward takes no tensor: an error naming it.
struct CounterImpl : torch::nn::Module {
  CounterImpl() { register_parameter("w", torch::ones({1})); }
  at::Tensor forward(int64_t n) { return named_parameters()["w"] * static_cast<double>(n); }
};
TORCH_MODULE(Counter);

TEST(ActivationCheckpoint, NoTensorInputIsAnErrorNamingTheModule) {
  Sequential net(Counter{});
  ASSERT_EQ(apply_activation_checkpointing(*net, SizeBasedAutoWrapPolicy(1)), 1);
  try {
    net->forward<at::Tensor>(int64_t{3});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint wrapper of " + Counter()->name() + ": forward was given no tensor"),
              std::string::npos)
        << e.what();
  }
}

class ActivationCheckpointFSDP : public testing::WorldSizeTest {};

// Trains `ac` and `plain` (same initial values) side by side on this rank's slices; losses,
// gradients and parameters must stay bitwise equal (recomputation repeats the same kernels).
using LossOf = std::function<at::Tensor(const at::Tensor&)>;

void expect_training_parity(torch::nn::Module& plain, const LossOf& plain_forward, torch::nn::Module& ac,
                            const LossOf& ac_forward, const std::function<at::Tensor(int)>& batch,
                            const std::string& what) {
  torch::optim::Adam plain_opt(plain.parameters(), 1e-2), ac_opt(ac.parameters(), 1e-2);
  for (int step = 0; step < 4; ++step) {
    at::Tensor x = batch(step);
    plain_opt.zero_grad();
    ac_opt.zero_grad();
    at::Tensor loss = plain_forward(x), ac_loss = ac_forward(x);
    EXPECT_TRUE(at::equal(loss, ac_loss)) << what << " step " << step;
    loss.backward();
    ac_loss.backward();
    expect_same_grads(plain, ac, what + " step " + std::to_string(step));
    plain_opt.step();
    ac_opt.step();
    if (::testing::Test::HasFailure()) return;
  }
  auto a = full_params(plain), b = full_params(ac);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << what << " param " << i;
}

// Seed 001's Transformer with checkpoint_activations (the `utils` variant): its forward
// checkpoints each block's call, as torch.utils.checkpoint.checkpoint(layer, h) does there.
// fsdpp's counterpart of that function is a checkpoint wrapper made for the call; the block it
// calls is the unit, so the checkpointed region holds the unit's gather and reshard, and the
// recomputation in backward runs the unit's forward again.
class UtilsCheckpointedTransformerImpl : public examples::TransformerImpl {
 public:
  using TransformerImpl::TransformerImpl;
  at::Tensor forward(at::Tensor tokens) {
    at::Tensor positions = torch::arange(tokens.size(1), torch::kLong);
    at::Tensor h = tok_embeddings->forward(tokens) + pos_embeddings->forward(positions);
    for (const auto& layer : *layers) {
      if (auto unit = std::dynamic_pointer_cast<FullyShardedDataParallelImpl<TransformerBlockImpl>>(layer.ptr()))
        h = checkpoint_wrapper(unit)->forward(h);
      else
        h = checkpoint_wrapper(layer.ptr<TransformerBlockImpl>())->forward(h);
    }
    return output->forward(norm->forward(h));
  }
};
TORCH_MODULE(UtilsCheckpointedTransformer);

// Seed 001 test_train_parity_with_activation_checkpointing: reshard_after_forward True / False /
// 2 (2 where it divides the group) x checkpoint_impl, each trained bitwise at parity with the
// same units without checkpointing, with the plain model's state dict keys:
// - `wrapper`: apply_activation_checkpointing on the blocks, then a unit around each checkpoint
//   wrapper (auto-wrap) and the root: FSDP(CheckpointWrapper(block)), as the seed.
// - `composable`: the seed's loop, per block checkpoint then fully_shard, then the root. libtorch
//   has no forward hooks, so the in-place checkpoint is a wrapper the unit holds: the
//   checkpointed region sits inside the unit's gather, as FSDP2's hooks order them.
// - `utils`: the model's forward checkpoints each block's call (UtilsCheckpointedTransformer),
//   the blocks units: CheckpointWrapper(FSDP(block)) at every call.
TEST_P(ActivationCheckpointFSDP, test_train_parity_with_activation_checkpointing) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    TransformerArgs args;
    const auto block_units = ModuleWrapPolicy<TransformerBlockImpl>();
    for (const auto& [options, raf] : reshard_after_forward_sweep(ctx.world_size))
      for (const std::string checkpoint_impl : {"composable", "utils", "wrapper"}) {
        const std::string what = raf + " checkpoint_impl " + checkpoint_impl;
        auto [plain_model, ac_model] = twins([&] { return Transformer(args); });
        auto plain = fully_shard(plain_model, FullyShardOptions(options).auto_wrap_policy(block_units));
        std::shared_ptr<torch::nn::Module> ac;
        LossOf ac_loss;
        auto loss_of = [](auto m) {
          return [m](const at::Tensor& tokens) mutable {
            return examples::language_model_loss(m->forward(tokens), tokens.roll(1, 1));
          };
        };
        if (checkpoint_impl == "wrapper") {
          ASSERT_EQ(apply_activation_checkpointing(*ac_model, block_units), args.n_layers);
          auto m = fully_shard(ac_model, FullyShardOptions(options).auto_wrap_policy(
                                             ModuleWrapPolicy<CheckpointWrapperImpl<TransformerBlockImpl>>()));
          ac = m.ptr();
          ac_loss = loss_of(m);
        } else if (checkpoint_impl == "composable") {
          Sequential blocks;
          for (const auto& layer : *ac_model->layers)
            blocks->push_back(fully_shard(checkpoint_wrapper(layer.ptr<TransformerBlockImpl>()), options));
          ac_model->layers = ac_model->replace_module("layers", blocks);
          auto m = fully_shard(ac_model, options);
          ac = m.ptr();
          ac_loss = loss_of(m);
        } else {
          torch::manual_seed(0);  // as twins(): the same initial values
          auto m = fully_shard(UtilsCheckpointedTransformer(args), FullyShardOptions(options).auto_wrap_policy(block_units));
          ac = m.ptr();
          ac_loss = loss_of(m);
        }
        EXPECT_EQ(fsdp_units(*ac).size(), fsdp_units(*plain).size()) << what << ": a unit per block and the root";
        const auto ac_keys = state_dict(*ac).keys();  // collective: the same order on every rank
        EXPECT_EQ(ac_keys, state_dict(*plain).keys()) << what;
        auto batch = [&](int step) {
          torch::manual_seed(100 * step + ctx.rank);
          return torch::randint(args.vocab_size, {2, args.max_seq_len});
        };
        expect_training_parity(*plain, loss_of(plain), *ac, ac_loss, batch, what);
        if (::testing::Test::HasFailure()) return;
      }
  });
}

// Seed 000's nested model with checkpoint wrappers inside and around units:
// FSDP(checkpoint_wrapper(Sequential(FSDP(checkpoint_wrapper(lin1)), checkpoint_wrapper(lin2)))),
// where the outer wrapper's recomputation runs the inner unit's forward again in backward.
Sequential nested(bool ac, const FullyShardOptions& o) {
  Linear l1(10, 10), l2(10, 10);
  if (!ac) return Sequential(FSDPSequential(Sequential(FSDPLinear(l1, o), l2), o));
  Sequential inner(fully_shard(checkpoint_wrapper(l1), o), checkpoint_wrapper(l2));
  return Sequential(fully_shard(checkpoint_wrapper(inner), o));
}

TEST_P(ActivationCheckpointFSDP, WrappersInsideAndAroundUnits) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (bool reshard_after_forward : {true, false}) {
      const auto o = FullyShardOptions().reshard_after_forward(reshard_after_forward);
      torch::manual_seed(0);
      Sequential plain = nested(false, o);
      torch::manual_seed(0);
      Sequential ac = nested(true, o);
      auto loss_of = [](Sequential m) {
        return [m](const at::Tensor& x) mutable { return m->forward(x).pow(2).mean(); };
      };
      auto batch = [&](int step) {
        torch::manual_seed(10 * step + ctx.rank);
        return torch::randn({4, 10});
      };
      expect_training_parity(*plain, loss_of(plain), *ac, loss_of(ac), batch,
                             std::string("nested, reshard_after_forward ") + (reshard_after_forward ? "T" : "F"));
      // Seed 000: keys without wrapper segments, FULL and SHARDED, loadable both ways: each
      // trained model's dict loads into a fresh model of the other kind (other initial values,
      // checked different first), which then holds the source's values, computes its output and
      // trains on at parity with the other loaded model.
      const auto source = full_params(*plain);
      at::Tensor probe = torch::randn({4, 10});
      auto output_of = [&](Sequential m) {
        torch::NoGradGuard no_grad;
        return m->forward(probe);
      };
      const at::Tensor source_out = output_of(plain), source_ac_out = output_of(ac);
      for (StateDictType type : {StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT}) {
        const std::string what = std::string("nested, reshard_after_forward ") + (reshard_after_forward ? "T, " : "F, ") +
                                 to_string(type);
        auto scope_plain = state_dict_type(*plain->ptr(0), type);
        auto scope_ac = state_dict_type(*ac->ptr(0), type);
        StateDict from_ac = state_dict(*ac), from_plain = state_dict(*plain);
        EXPECT_EQ(from_ac.keys(), from_plain.keys()) << what;
        EXPECT_EQ(from_ac.keys(), (std::vector<std::string>{"0.0.weight", "0.0.bias", "0.1.weight", "0.1.bias"}));
        torch::manual_seed(1);
        Sequential plain_loaded = nested(false, o);
        torch::manual_seed(1);
        Sequential ac_loaded = nested(true, o);
        for (auto* m : {&plain_loaded, &ac_loaded}) {
          auto before = full_params(**m);
          for (size_t i = 0; i < before.size(); ++i)
            EXPECT_FALSE(at::equal(before[i], source[i])) << what << " param " << i << " equal before the load";
        }
        {
          auto load_scope_plain = state_dict_type(*plain_loaded->ptr(0), type);
          auto load_scope_ac = state_dict_type(*ac_loaded->ptr(0), type);
          auto plain_result = load_state_dict(*plain_loaded, from_ac);
          auto ac_result = load_state_dict(*ac_loaded, from_plain);
          EXPECT_TRUE(plain_result.missing_keys.empty() && plain_result.unexpected_keys.empty()) << what;
          EXPECT_TRUE(ac_result.missing_keys.empty() && ac_result.unexpected_keys.empty()) << what;
        }
        for (auto* m : {&plain_loaded, &ac_loaded}) {
          auto after = full_params(**m);
          ASSERT_EQ(after.size(), source.size()) << what;
          for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(at::equal(after[i], source[i])) << what << " param " << i;
        }
        EXPECT_TRUE(at::equal(output_of(plain_loaded), source_ac_out)) << what << ": plain loaded from the AC model";
        EXPECT_TRUE(at::equal(output_of(ac_loaded), source_out)) << what << ": AC model loaded from the plain one";
        expect_training_parity(*plain_loaded, loss_of(plain_loaded), *ac_loaded, loss_of(ac_loaded), batch,
                               what + ", the loaded models");
        if (::testing::Test::HasFailure()) return;
      }
    }
  });
}

// A Linear that counts its forward calls, those made with grad mode off (a checkpointed call's
// first run; its recomputation in backward runs with grad on) and those that saw its whole
// weight (gathered by its unit, not a shard).
struct CountingLinearImpl : torch::nn::LinearImpl {
  using LinearImpl::LinearImpl;
  at::Tensor forward(const at::Tensor& x) {
    ++calls;
    if (!torch::autograd::GradMode::is_enabled()) ++no_grad_calls;
    if (weight.size(0) == options.out_features()) ++gathered_calls;
    return LinearImpl::forward(x);
  }
  int calls = 0, no_grad_calls = 0, gathered_calls = 0;
};
TORCH_MODULE(CountingLinear);

// apply_activation_checkpointing after wrapping (seed 000's `*_after_wrap`): the policy selects
// the Linears the units wrap, typed units (ModuleWrapPolicy) and type-blind ones (SizeBased-
// AutoWrapPolicy's, through the element's AnyModule). Each unit then runs its Linear under
// checkpoint: once without grad in forward and again in backward (after the unit gathered
// again, reshard_after_forward T, or kept its parameters, F), and trains bitwise at parity with
// the same units without checkpointing. World sizes 2 and 3 only (3 pads the shards; 1 shards
// nothing), to keep the suite's time.
class ActivationCheckpointAfterWrap : public testing::WorldSizeTest {};

TEST_P(ActivationCheckpointAfterWrap, AppliedAfterWrapping) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (const auto& [typed, reshard_after_forward] :
         std::initializer_list<std::pair<bool, bool>>{{true, true}, {true, false}, {false, true}}) {
      const std::string what = std::string(typed ? "typed" : "type-blind") + " units, reshard_after_forward " +
                               (reshard_after_forward ? "T" : "F");
      const auto o = FullyShardOptions().reshard_after_forward(reshard_after_forward).auto_wrap_policy(
          typed ? ModuleWrapPolicy<CountingLinearImpl>() : SizeBasedAutoWrapPolicy(100));
      std::vector<CountingLinear> linears;
      auto make = [&] {
        torch::manual_seed(0);
        CountingLinear l1(10, 16), l2(16, 10);
        linears.push_back(l1);
        linears.push_back(l2);
        return fully_shard(Sequential(l1, ReLU(), l2), o);
      };
      auto plain = make();
      auto ac = make();
      int typed_units = 0;
      for (FSDPModule* unit : fsdp_units(*ac))
        typed_units += dynamic_cast<FullyShardedDataParallelImpl<CountingLinearImpl>*>(unit) != nullptr;
      EXPECT_EQ(typed_units, typed ? 2 : 0) << what;
      ASSERT_EQ(apply_activation_checkpointing(*ac, ModuleWrapPolicy<CountingLinearImpl>()), 2) << what;
      EXPECT_EQ(apply_activation_checkpointing(*ac, ModuleWrapPolicy<CountingLinearImpl>()), 0)
          << what << ": a checkpointing unit is not counted again";
      EXPECT_EQ(state_dict(*ac).keys(), state_dict(*plain).keys()) << what;
      auto loss_of = [](FullyShardedDataParallel<torch::nn::SequentialImpl> m) {
        return [m](const at::Tensor& x) mutable { return m->forward(x).pow(2).mean(); };
      };
      auto batch = [&](int step) {
        torch::manual_seed(10 * step + ctx.rank);
        return torch::randn({4, 10});
      };
      expect_training_parity(*plain, loss_of(plain), *ac, loss_of(ac), batch, what);
      for (int i = 0; i < 2; ++i) {  // 4 steps
        EXPECT_EQ(linears[i]->calls, 4) << what << ": plain Linear " << i;
        EXPECT_EQ(linears[i]->no_grad_calls, 0) << what << ": plain Linear " << i;
        EXPECT_EQ(linears[2 + i]->calls, 8) << what << ": checkpointed Linear " << i << " runs twice a step";
        EXPECT_EQ(linears[2 + i]->no_grad_calls, 4) << what << ": checkpointed Linear " << i;
        EXPECT_EQ(linears[2 + i]->gathered_calls, 8) << what << ": checkpointed Linear " << i << " recomputed on shards";
      }
      if (::testing::Test::HasFailure()) return;
    }
    // The policy counts a unit's module at its global size (the Linears 176 and 170, each rank
    // holding a shard of them): the same units on every world size, the root's Sequential (346)
    // included.
    torch::manual_seed(0);
    auto model = fully_shard(Sequential(CountingLinear(10, 16), ReLU(), CountingLinear(16, 10)),
                             FullyShardOptions().auto_wrap_policy(SizeBasedAutoWrapPolicy(100)));
    EXPECT_EQ(apply_activation_checkpointing(*model, SizeBasedAutoWrapPolicy(170)), 3);
  });
}
// The policy counts a tensor-parallel module at its global size too (Linear(10, 16) colwise: 176,
// Linear(16, 10) rowwise: 170, each rank holding about 1 / n of them), so every rank
// checkpoints the same modules.
TEST_P(ActivationCheckpointAfterWrap, TensorParallelModulesCountAtTheirGlobalSize) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(0);
    Sequential model(Linear(10, 16), ReLU(), Linear(16, 10));
    parallelize_module(*model, ctx.world, {{"0", ColwiseParallel()}, {"2", RowwiseParallel()}});
    EXPECT_EQ(apply_activation_checkpointing(*model, SizeBasedAutoWrapPolicy(170)), 2);
  });
}
INSTANTIATE_TEST_SUITE_P(, ActivationCheckpointAfterWrap, ::testing::Values(2, 3), testing::world_size_name);

// The model's full parameters, by the engine's own all-gather.
std::vector<at::Tensor> gathered_params(torch::nn::Module& model) { return full_params(model); }

// Takes `source`'s state dict of `type` (FULL also with rank0_only + offload, SHARDED with
// offload, the seed's state_dict_rank0_and_offload) and loads it strictly into `dest` (rank 0's
// FULL dict reaches the other ranks by broadcast_from_rank0, as the seed broadcasts it).
void save_and_load(torch::nn::Module& source, torch::nn::Module& dest, StateDictType type, bool rank0_and_offload) {
  std::optional<StateDictConfig> config;
  if (rank0_and_offload)
    config = type == StateDictType::FULL_STATE_DICT ? StateDictConfig(FullStateDictConfig().rank0_only(true).offload_to_cpu(true))
                                                    : StateDictConfig(ShardedStateDictConfig().offload_to_cpu(true));
  StateDict sd;
  {
    auto scope = state_dict_type(source, type, config);
    sd = state_dict(source);
  }
  if (rank0_and_offload && type == StateDictType::FULL_STATE_DICT) {
    set_model_state_dict(dest, sd, StateDictOptions().full_state_dict(true).broadcast_from_rank0(true));
  } else {
    auto scope = state_dict_type(dest, type);
    auto result = load_state_dict(dest, sd);
    EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
  }
}

// Seed 000 test_fsdp_state_dict_with_activation_checkpoint: the seed's simple model (a unit of
// one Linear) and simple nested model (a unit holding a unit and a Linear), with checkpoint
// wrappers on the source, the destination or both (wrapped before FSDP: inside the units and,
// for the nested model, around the root's Sequential), or apply_activation_checkpointing on
// the Linears after wrapping (`*_after_wrap`: the units checkpoint the Linears they wrap, the
// nested model's plain Linear is replaced); the source trained a step, the destination zeroed
// (checked different), the state dict loaded strictly: the destination then holds the source's
// values. FULL and SHARDED x rank0_only_and_offload F/T.
TEST_P(ActivationCheckpointFSDP, FsdpStateDictWithActivationCheckpoint) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto o = FullyShardOptions();
    auto simple = [&](bool ac) {
      torch::manual_seed(0);
      Linear lin(10, 10);
      return ac ? Sequential(fully_shard(checkpoint_wrapper(lin), o)) : Sequential(FSDPLinear(lin, o));
    };
    auto simple_nested = [&](bool ac) {
      torch::manual_seed(0);
      return nested(ac, o);
    };
    for (const auto& [model_name, make] : {std::pair<std::string, std::function<Sequential(bool)>>{"simple", simple},
                                           std::pair<std::string, std::function<Sequential(bool)>>{"nested", simple_nested}})
      for (const std::string checkpoint_wrap : {"source", "dest", "both", "source_after_wrap", "both_after_wrap"})
        for (StateDictType type : {StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT})
          for (bool rank0_and_offload : {false, true}) {
            const std::string what = model_name + " checkpoint_wrap " + checkpoint_wrap + " " + to_string(type) +
                                     (rank0_and_offload ? " rank0_only+offload" : "");
            // simple: its unit's Linear; nested: the inner unit's Linear and the plain one.
            const int linears = model_name == "simple" ? 1 : 2;
            auto ac_to_linears = [&](Sequential m) {
              EXPECT_EQ(apply_activation_checkpointing(*m, ModuleWrapPolicy<torch::nn::LinearImpl>()), linears) << what;
            };
            const bool after_wrap = checkpoint_wrap == "source_after_wrap" || checkpoint_wrap == "both_after_wrap";
            Sequential source = make(checkpoint_wrap == "source" || checkpoint_wrap == "both");
            if (after_wrap) ac_to_linears(source);
            {
              torch::optim::SGD opt(source->parameters(), 0.1);
              torch::manual_seed(10 + ctx.rank);
              source->forward(torch::randn({4, 10})).pow(2).mean().backward();
              opt.step();
            }
            Sequential dest = make(checkpoint_wrap == "dest" || checkpoint_wrap == "both");
            if (checkpoint_wrap == "both_after_wrap") ac_to_linears(dest);
            {
              torch::NoGradGuard no_grad;
              for (auto& p : dest->parameters()) p.zero_();
            }
            const auto expected = gathered_params(*source);
            auto before = gathered_params(*dest);
            ASSERT_EQ(before.size(), expected.size()) << what;
            for (size_t i = 0; i < before.size(); ++i)
              EXPECT_FALSE(at::equal(before[i], expected[i])) << what << ": param " << i << " equal before the load";
            save_and_load(*source->ptr(0), *dest->ptr(0), type, rank0_and_offload);
            auto after = gathered_params(*dest);
            for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(at::equal(after[i], expected[i])) << what << ": param " << i;
            if (::testing::Test::HasFailure()) return;
          }
  });
}

// Seed 000 test_state_dict_with_manual_ac_wrapper: a transformer wrapped by hand with a unit per
// block and the root, and its twin with FSDP(CheckpointWrapper(block)) per block. Their FULL /
// SHARDED state dicts (FULL also rank0_only + offload) have the same keys; each loads into the
// other zeroed, which then holds the same values.
TEST_P(ActivationCheckpointFSDP, StateDictWithManualAcWrapper) {
  run_ranks(GetParam(), [](RankContext&) {
    TransformerArgs args;
    auto make = [&](bool ac) {
      torch::manual_seed(0);
      Transformer model(args);
      if (ac) apply_activation_checkpointing(*model, ModuleWrapPolicy<TransformerBlockImpl>());
      return fully_shard(model, FullyShardOptions().auto_wrap_policy(
                                    ac ? ModuleWrapPolicy<CheckpointWrapperImpl<TransformerBlockImpl>>()
                                       : ModuleWrapPolicy<TransformerBlockImpl>()));
    };
    for (StateDictType type : {StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT})
      for (bool rank0_and_offload : {false, true}) {
        if (rank0_and_offload && type != StateDictType::FULL_STATE_DICT) continue;  // as the seed
        const std::string what = std::string(to_string(type)) + (rank0_and_offload ? " rank0_only+offload" : "");
        auto no_ac = make(false), ac = make(true);
        ASSERT_EQ(fsdp_units(*ac).size(), fsdp_units(*no_ac).size());
        {
          auto s1 = state_dict_type(*no_ac, type);
          auto s2 = state_dict_type(*ac, type);
          EXPECT_EQ(state_dict(*ac).keys(), state_dict(*no_ac).keys()) << what;
        }
        const auto values = gathered_params(*no_ac);
        auto ac_target = make(true), no_ac_target = make(false);
        for (auto* m : {static_cast<torch::nn::Module*>(ac_target.ptr().get()), static_cast<torch::nn::Module*>(no_ac_target.ptr().get())}) {
          torch::NoGradGuard no_grad;
          for (auto& p : m->parameters()) p.zero_();
        }
        save_and_load(*no_ac, *ac_target, type, rank0_and_offload);
        save_and_load(*ac, *no_ac_target, type, rank0_and_offload);
        auto a = gathered_params(*ac_target), b = gathered_params(*no_ac_target);
        ASSERT_EQ(a.size(), values.size()) << what;
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_TRUE(at::equal(a[i], values[i])) << what << ": AC model param " << i;
          EXPECT_TRUE(at::equal(b[i], values[i])) << what << ": plain model param " << i;
        }
        if (::testing::Test::HasFailure()) return;
      }
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(ActivationCheckpointFSDP);

}  // namespace
}  // namespace fsdpp
