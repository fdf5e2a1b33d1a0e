// Deferred (meta-device) initialization: construction allocates nothing, every rank allocates
// only its shards plus one unit at a time, and the values equal the plain model's built and
// materialized the same way, element for element, at every world size and under HSDP.
#include <map>
#include <string>

#include <fsdpp/checkpoint.h>
#include <fsdpp/deferred_init.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/memory.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/wrap_policy.h>

#include "dist/deferred_init_fixtures.h"
#include "dist/fsdp_test_util.h"
#include "harness/error_of.h"
#include "transformer.h"

namespace fsdpp {
namespace {

using examples::Transformer;
using examples::TransformerArgs;
using examples::TransformerBlockImpl;
namespace ckpt = checkpoint;

using testing::small_transformer_args;
using testing::transformer_init_options;

// A module with buffers beside the transformer: BatchNorm's running statistics.
struct NormedTransformerImpl : torch::nn::Module {
  explicit NormedTransformerImpl(const TransformerArgs& args) {
    body = register_module("body", Transformer(args));
    norm = register_module("norm", torch::nn::BatchNorm1d(args.vocab_size));
  }
  at::Tensor forward(const at::Tensor& tokens) { return norm->forward(body->forward(tokens).transpose(1, 2)).transpose(1, 2); }
  Transformer body{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(NormedTransformer);

// The reference: the plain model built deferred and materialized in this one process.
NormedTransformer plain_reference(uint64_t seed = 0) {
  auto model = deferred_init([] { return NormedTransformer(small_transformer_args()); });
  materialize_module(*model, transformer_init_options(seed));
  return model;
}

std::map<std::string, at::Tensor> values_of(torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) out[strip_wrapper_prefixes(p.key())] = p.value().detach().clone();
  for (const auto& b : model.named_buffers()) out[strip_wrapper_prefixes(b.key())] = b.value().detach().clone();
  return out;
}

int64_t bytes_of(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.numel() * t.element_size();
  return n;
}

TEST(DeferredInit, ConstructionAllocatesNothingAndEndsCleanly) {
  TransformerArgs big;
  big.n_layers = 8;
  big.dim = 256;  // 6.4 M parameters: 25 MiB if allocated
  const int64_t before = memory_stats().current_bytes;
  auto model = deferred_init([&] { return NormedTransformer(big); });
  EXPECT_LT(memory_stats().current_bytes - before, 64 << 10);
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.is_meta());
  // Buffers too, but for torch::tensor literals (BatchNorm's num_batches_tracked), which
  // libtorch builds on the CPU whatever the scope: one element each.
  for (const auto& b : model->named_buffers()) EXPECT_TRUE(b.value().is_meta() || b.value().numel() == 1) << b.key();
  EXPECT_TRUE(has_deferred_tensors(*model));
  // After the scope, factories and ops are on the CPU again (libtorch 2.6's own guard left ops on meta).
  at::Tensor x = torch::ones({2});
  EXPECT_TRUE(x.device().is_cpu());
  EXPECT_TRUE((x + 1).device().is_cpu());
  {
    MetaDeviceGuard outer;
    { MetaDeviceGuard inner; }
    EXPECT_TRUE(torch::ones({2}).is_meta());  // an inner guard's end keeps the outer's scope
  }
  EXPECT_TRUE((x * 2).device().is_cpu());
}

// The module's own initializers run on the real tensors: a Linear's weight within Kaiming's
// bound 1/sqrt(fan_in) and spread across it, LayerNorm ones and zeros, BatchNorm's statistics
// reset; values depend on the seed only, not on the order or the number of builds.
TEST(DeferredInit, PlainModelIsInitializedByEachModule) {
  NormedTransformer a = plain_reference(), b = plain_reference(), c = plain_reference(/*seed=*/1);
  EXPECT_FALSE(has_deferred_tensors(*a));
  const auto va = values_of(*a), vb = values_of(*b), vc = values_of(*c);
  for (const auto& [name, v] : va) {
    EXPECT_TRUE(v.device().is_cpu()) << name;
    EXPECT_TRUE(at::equal(v, vb.at(name))) << name;
  }
  const at::Tensor w1 = va.at("body.layers.0.feed_forward.w1.weight");
  const double bound = 1.0 / std::sqrt(16.0);
  EXPECT_LE(w1.abs().max().item<double>(), bound);
  EXPECT_GT(w1.abs().max().item<double>(), 0.9 * bound);
  EXPECT_FALSE(at::equal(w1, vc.at("body.layers.0.feed_forward.w1.weight")));
  // Two blocks of one shape get different values (each module's own seed).
  EXPECT_FALSE(at::equal(w1, va.at("body.layers.1.feed_forward.w1.weight")));
  EXPECT_TRUE(at::equal(va.at("body.layers.0.attention_norm.weight"), torch::ones({16})));
  EXPECT_TRUE(at::equal(va.at("body.layers.0.attention_norm.bias"), torch::zeros({16})));
  EXPECT_TRUE(at::equal(va.at("norm.running_var"), torch::ones({40})));
  EXPECT_EQ(va.at("norm.num_batches_tracked").item<int64_t>(), 0);
  EXPECT_NEAR(va.at("body.tok_embeddings.weight").std().item<double>(), 1.0, 0.15);  // N(0, 1)
  const at::Tensor out = va.at("body.output.weight");
  EXPECT_LE(out.abs().max().item<double>(), bound);
  EXPECT_GT(out.abs().max().item<double>(), 0.9 * bound);
  // It trains like any model.
  torch::optim::SGD opt(a->parameters(), 0.1);
  at::Tensor tokens = torch::randint(40, {2, 8});
  examples::language_model_loss(a->forward(tokens), tokens).backward();
  opt.step();
}

class DeferredInitSharded : public testing::WorldSizeTest {};

// fully_shard of the deferred model (each block a unit, the ends the root's), then
// materialize_module: the gathered values equal the plain reference element for element;
// memory during materialization stays within the shards plus one unit; a training step then
// matches the reference's on the global batch.
TEST_P(DeferredInitSharded, EqualsThePlainModelAndTrains) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    NormedTransformer reference = plain_reference();
    const auto expected = values_of(*reference);
    auto model = deferred_init([] { return NormedTransformer(small_transformer_args()); });
    auto options = FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>());
    auto root = fully_shard(model, options);
    EXPECT_TRUE(has_deferred_tensors(*root));
    const int64_t base = memory_stats().current_bytes;
    reset_peak_memory_stats();
    materialize_module(*root, transformer_init_options());
    EXPECT_FALSE(has_deferred_tensors(*root));
    // Beyond the shards (allocated by fully_shard): the buffers and one unit at a time (the
    // largest is a block, a sixth of the model), not the model.
    int64_t largest_unit = 0;
    for (FSDPModule* unit : fsdp_units(*root)) largest_unit = std::max(largest_unit, unit->unsharded_padded_numel() * 4);
    const int64_t full = bytes_of(reference->parameters()), buffers = bytes_of(reference->buffers());
    EXPECT_LT(2 * largest_unit, full);
    EXPECT_LE(memory_stats().peak_bytes - base, buffers + largest_unit + (8 << 10)) << "whole model " << full;
    const auto actual = [&] {
      auto guard = summon_full_params(*root, /*writeback=*/false);
      return values_of(*root);
    }();
    ASSERT_EQ(actual.size(), expected.size());
    for (const auto& [name, v] : expected) EXPECT_TRUE(at::equal(actual.at(name), v)) << name;

    // SGD: the BatchNorm after the output leaves the final norm's bias a gradient of rounding
    // noise only, which Adam would scale up to its step size.
    torch::optim::SGD opt(root->parameters(), 0.1), ref_opt(reference->parameters(), 0.1);
    torch::manual_seed(7);
    at::Tensor tokens = torch::randint(40, {kGlobalBatch, 8});
    const int64_t local = kGlobalBatch / ctx.world_size;
    examples::language_model_loss(root->forward(tokens.narrow(0, ctx.rank * local, local)), tokens.narrow(0, ctx.rank * local, local))
        .backward();
    opt.step();
    // The reference: the mean of the per-rank losses (BatchNorm normalizes each rank's slice).
    at::Tensor ref_loss = at::zeros({});
    for (int r = 0; r < ctx.world_size; ++r) {
      at::Tensor slice = tokens.narrow(0, r * local, local);
      ref_loss = ref_loss + examples::language_model_loss(reference->forward(slice), slice);
    }
    (ref_loss / ctx.world_size).backward();
    ref_opt.step();
    auto guard = summon_full_params(*root, /*writeback=*/false);
    const auto after = values_of(*root);
    for (const auto& p : reference->named_parameters()) expect_close(after.at(p.key()), p.value().detach(), p.key());
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(DeferredInitSharded);

// HSDP (2 x 2) and the FSDP1 wrapper: the same values as the plain model.
TEST(DeferredInitHSDP, EqualsThePlainModel) {
  run_ranks(4, [](RankContext& ctx) {
    const auto expected = values_of(*plain_reference());
    auto model = deferred_init([] { return NormedTransformer(small_transformer_args()); });
    auto options = FullyShardOptions()
                       .mesh(init_device_mesh(ctx.world, {2, 2}, {"replicate", "shard"}))
                       .auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>());
    FullyShardedDataParallel<NormedTransformerImpl> root(model, options);
    materialize_module(*root, transformer_init_options());
    auto guard = summon_full_params(*root, /*writeback=*/false);
    const auto actual = values_of(*root);
    for (const auto& [name, v] : expected) EXPECT_TRUE(at::equal(actual.at(name), v)) << name;
  });
}

// Under a lower param_dtype the unit is materialized in its parameters' own dtype (float32),
// not the bfloat16 of its compute buffer: the values are the plain model's exactly.
TEST(DeferredInitMixedPrecision, MaterializesInTheParametersDtype) {
  run_ranks(2, [](RankContext&) {
    const auto expected = values_of(*plain_reference());
    auto options = FullyShardOptions()
                       .auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>())
                       .mp_policy(MixedPrecisionPolicy().param_dtype(at::kBFloat16));
    auto root = fully_shard(deferred_init([] { return NormedTransformer(small_transformer_args()); }), options);
    materialize_module(*root, transformer_init_options());
    auto guard = summon_full_params(*root, /*writeback=*/false);
    const auto actual = values_of(*root);
    for (const auto& [name, v] : expected) EXPECT_TRUE(at::equal(actual.at(name), v)) << name;
  });
}

// Straight from a checkpoint or a safetensors file: to_empty gives the shards memory, a sharded
// load fills them.
TEST(DeferredInitCheckpoint, ToEmptyThenLoadGivesTheSavedModel) {
  run_ranks(4, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    auto options = FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>());
    auto saved_model = fully_shard(plain_reference(/*seed=*/3), options);
    std::map<std::string, at::Tensor> saved;
    {
      auto scope = state_dict_type(*saved_model.ptr(), StateDictType::SHARDED_STATE_DICT);
      ckpt::save(ckpt::to_state(state_dict(saved_model), "model."), dir);
      auto guard = summon_full_params(*saved_model, /*writeback=*/false);
      saved = values_of(*saved_model);
    }
    auto model = fully_shard(deferred_init([] { return NormedTransformer(small_transformer_args()); }), options);
    to_empty(*model);
    EXPECT_FALSE(has_deferred_tensors(*model));
    {
      auto scope = state_dict_type(*model.ptr(), StateDictType::SHARDED_STATE_DICT);
      StateDict sd = state_dict(model);
      ckpt::State state = ckpt::to_state(sd, "model.");
      ckpt::load(state, dir);
      load_state_dict(model, sd);
    }
    {
      auto guard = summon_full_params(*model, /*writeback=*/false);
      const auto loaded = values_of(*model);
      for (const auto& [name, v] : saved) EXPECT_TRUE(at::equal(loaded.at(name), v)) << name;
    }
    // From a safetensors file (export_safetensors' output, as Hugging Face ships models): each
    // rank reads only its rows; the load's memory beyond the shards stays below half the model.
    const std::string file = ctx.temp_dir + "/model.safetensors";
    ckpt::export_safetensors(saved_model, file);
    auto from_file = fully_shard(deferred_init([] { return NormedTransformer(small_transformer_args()); }), options);
    to_empty(*from_file);
    const int64_t base = memory_stats().current_bytes;
    reset_peak_memory_stats();
    {
      auto scope = state_dict_type(*from_file.ptr(), StateDictType::SHARDED_STATE_DICT);
      StateDict sd = state_dict(from_file);
      ckpt::State state = ckpt::to_state(sd);
      ckpt::load_safetensors(state, file);
      load_state_dict(from_file, sd);
    }
    // Beyond the shards: the state dict's entries and the read buffers, each this rank's rows
    // (at N = 4 a quarter of the model each), never the model.
    int64_t model_bytes = 0;
    for (const auto& [name, v] : saved) model_bytes += v.numel() * v.element_size();
    EXPECT_LT(memory_stats().peak_bytes - base, 2 * model_bytes / ctx.world_size + (4 << 10)) << "model " << model_bytes;
    auto guard = summon_full_params(*from_file, /*writeback=*/false);
    const auto loaded = values_of(*from_file);
    for (const auto& [name, v] : saved) EXPECT_TRUE(at::equal(loaded.at(name), v)) << name;
  });
}

// FSDP1's sync_module_states: rank 0 holds the values (built eagerly, as after loading a
// pretrained file), the other ranks build the model deferred; every rank ends with rank 0's
// parameters and buffers, under FSDP and HSDP 2 x 2. Rank 0 without values is an error on every
// rank alike.
TEST(DeferredInitSyncModuleStates, OtherRanksTakeRankZerosValues) {
  run_ranks(4, [](RankContext& ctx) {
    for (bool hsdp : {false, true}) {
      torch::manual_seed(11);
      NormedTransformer eager(small_transformer_args());  // built here on every rank only for the reference
      {
        torch::NoGradGuard no_grad;
        for (auto& b : eager->buffers())
          if (b.is_floating_point()) b.add_(0.5);  // buffers an initialization would not give
      }
      const auto expected = values_of(*eager);
      auto options = FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>()).sync_module_states(true);
      if (hsdp) options.mesh(init_device_mesh(ctx.world, {2, 2}, {"replicate", "shard"}));
      NormedTransformer model = ctx.rank == 0 ? eager : deferred_init([] { return NormedTransformer(small_transformer_args()); });
      FullyShardedDataParallel<NormedTransformerImpl> root(model, options);
      EXPECT_FALSE(has_deferred_tensors(*root));
      auto guard = summon_full_params(*root, /*writeback=*/false);
      const auto actual = values_of(*root);
      for (const auto& [name, v] : expected) EXPECT_TRUE(at::equal(actual.at(name), v)) << (hsdp ? "HSDP " : "") << name;
    }
    const std::string what = testing::error_of([] {
      fully_shard(deferred_init([] { return torch::nn::Sequential(torch::nn::Linear(4, 4)); }),
                  FullyShardOptions().sync_module_states(true));
    });
    EXPECT_NE(what.find("with sync_module_states: rank 0 holds no values for '0.weight'"), std::string::npos) << what;
    const std::string buffer_error = testing::error_of([] {
      fully_shard(deferred_init([] { return torch::nn::Sequential(torch::nn::BatchNorm1d(4)); }),
                  FullyShardOptions().sync_module_states(true));
    });
    EXPECT_NE(buffer_error.find("rank 0 holds no values for buffer '0.running_mean'"), std::string::npos) << buffer_error;
  });
}

// A module of the user's own with deferred parameters and no initializer: refused before any
// tensor is allocated, naming the module, its type and the tensor.
struct Scale : torch::nn::Module {
  Scale() { gain = register_parameter("gain", torch::ones({4})); }
  at::Tensor forward(const at::Tensor& x) { return x * gain; }
  at::Tensor gain;
};

TEST(DeferredInitErrors, ModuleWithoutInitializerIsNamed) {
  run_ranks(1, [](RankContext&) {
    auto model = deferred_init([] {
      auto seq = torch::nn::Sequential(torch::nn::Linear(4, 4));
      seq->push_back(std::make_shared<Scale>());
      return seq;
    });
    const std::string what = testing::error_of([&] { materialize_module(*model); });
    EXPECT_NE(what.find("module '1' ("), std::string::npos) << what;
    EXPECT_NE(what.find("Scale) has deferred tensors 'gain'"), std::string::npos) << what;
    EXPECT_NE(what.find("param_init_fn"), std::string::npos) << what;
    for (const auto& p : model->parameters()) EXPECT_TRUE(p.is_meta());  // nothing touched
    // A param_init_fn that handles it (and leaves the Linear to the default).
    materialize_module(*model, MaterializeOptions().param_init_fn([](torch::nn::Module& m) {
      auto* s = dynamic_cast<Scale*>(&m);
      if (s) s->gain.fill_(2.0);
      return s != nullptr;
    }));
    EXPECT_TRUE(at::equal(model->named_parameters()["1.gain"], torch::full({4}, 2.0)));
    EXPECT_FALSE(has_deferred_tensors(*model));
  });
}

// Forward before materialization names the unit; a unit mixing meta and real parameters is
// refused at wrapping, naming both; so is DDP of a deferred model.
TEST(DeferredInitErrors, ForwardBeforeMaterializeAndMixedUnits) {
  run_ranks(1, [](RankContext&) {
    auto model = fully_shard(deferred_init([] { return torch::nn::Sequential(torch::nn::Linear(4, 4)); }));
    std::string what = testing::error_of([&] { model->forward(torch::ones({1, 4})); });
    EXPECT_NE(what.find("built under fsdpp::deferred_init"), std::string::npos) << what;
    EXPECT_NE(what.find("materialize_module"), std::string::npos) << what;

    torch::nn::Linear real(4, 4);
    auto meta = deferred_init([] { return torch::nn::Linear(4, 4); });
    what = testing::error_of([&] { fully_shard(torch::nn::Sequential(real, meta)); });
    EXPECT_NE(what.find("parameter '1.weight' is on meta but '0.weight' is on cpu"), std::string::npos) << what;

    // DDP replicates a materialized model.
    what = testing::error_of([&] { DistributedDataParallel<torch::nn::LinearImpl> ddp(meta); });
    EXPECT_NE(what.find("'weight' is on the meta device"), std::string::npos) << what;
    EXPECT_NE(what.find("materialize_module"), std::string::npos) << what;
  });
}

}  // namespace
}  // namespace fsdpp
