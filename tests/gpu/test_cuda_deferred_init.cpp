// FullyShardOptions::device_id (FSDP1's): a model built deferred gets its shards on the GPU and the
// values of the CPU materialization element for element, the GPU holding the shards and one unit
// for a moment;
// an eager CPU model is sharded straight onto the GPU, buffers included; the root moves CPU
// inputs to the GPU and a step matches the plain model's on the CPU. 1-4 ranks sharing one GPU
// over Gloo. Skipped where no GPU is seen.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>

#include <torch/torch.h>

#include <fsdpp/deferred_init.h>
#include <fsdpp/memory.h>
#include <fsdpp/wrap_policy.h>

#include "dist/deferred_init_fixtures.h"
#include "gpu/gpu_fixtures.h"

namespace fsdpp {
namespace {

using examples::Transformer;
using examples::TransformerBlockImpl;
using testing::kGpu;

using testing::small_transformer_args;
using testing::transformer_init_options;

// Every parameter and buffer, full and on the CPU, under the plain model's names.
std::map<std::string, at::Tensor> full_values_on_the_cpu(torch::nn::Module& model) {
  auto guard = summon_full_params(model, /*writeback=*/false);
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) out[strip_wrapper_prefixes(p.key())] = p.value().detach().cpu().clone();
  for (const auto& b : model.named_buffers()) out[strip_wrapper_prefixes(b.key())] = b.value().detach().cpu().clone();
  return out;
}

// One SGD step on this rank's slice of a fixed batch of CPU tokens, which the root moves to the
// GPU; the plain model on the CPU takes the whole batch. Parameters compared afterwards.
void expect_step_like_the_plain_model(RankContext& ctx, torch::nn::Module& root,
                                      const std::function<at::Tensor(const at::Tensor&)>& forward, Transformer& plain) {
  torch::optim::SGD opt(root.parameters(), 0.1), plain_opt(plain->parameters(), 0.1);
  torch::manual_seed(11);
  const at::Tensor tokens = torch::randint(40, {kGlobalBatch, 8});
  const int64_t local = kGlobalBatch / ctx.world_size;
  const at::Tensor mine = tokens.narrow(0, ctx.rank * local, local);
  at::Tensor logits = forward(mine);
  EXPECT_TRUE(logits.is_cuda());
  examples::language_model_loss(logits, mine.to(kGpu)).backward();
  opt.step();
  examples::language_model_loss(plain->forward(tokens), tokens).backward();
  plain_opt.step();
  const auto after = full_values_on_the_cpu(root);
  for (const auto& p : plain->named_parameters()) expect_close(after.at(p.key()), p.value().detach(), p.key());
}

class CudaDeferredInit : public testing::WorldSizeTest {};

TEST_P(CudaDeferredInit, ShardsOnTheGpuWithTheCpuValues) {
  FSDPP_SKIP_WITHOUT_CUDA();
  run_ranks(GetParam(), [](RankContext& ctx) {
    Transformer plain = deferred_init([] { return Transformer(small_transformer_args()); });
    materialize_module(*plain, transformer_init_options(3));
    const auto expected = full_values_on_the_cpu(*plain);

    Transformer model = deferred_init([] { return Transformer(small_transformer_args()); });
    auto options = FullyShardOptions().device_id(kGpu).auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>());
    auto root = fully_shard(model, options);
    for (const auto& p : root->parameters()) EXPECT_TRUE(p.is_cuda());
    const int64_t shards = memory_stats(kGpu).current_bytes;
    reset_peak_memory_stats(kGpu);
    materialize_module(*root, transformer_init_options(3));
    // Values are drawn on the host and only this rank's rows copied: beyond the shards the GPU
    // sees one unit's compute buffer for a moment (its views rebound), never the model.
    int64_t largest_unit = 0;
    for (FSDPModule* unit : fsdp_units(*root)) largest_unit = std::max(largest_unit, unit->unsharded_padded_numel() * 4);
    EXPECT_LE(memory_stats(kGpu).peak_bytes - shards, largest_unit);
    EXPECT_EQ(memory_stats(kGpu).current_bytes, shards);
    EXPECT_FALSE(has_deferred_tensors(*root));
    const auto actual = full_values_on_the_cpu(*root);
    ASSERT_EQ(actual.size(), expected.size());
    for (const auto& [name, v] : expected) EXPECT_TRUE(at::equal(actual.at(name), v)) << name;
    expect_step_like_the_plain_model(ctx, *root, [&](const at::Tensor& t) { return root->forward(t); }, plain);
  });
}

TEST_P(CudaDeferredInit, EagerCpuModelShardedOntoTheGpu) {
  FSDPP_SKIP_WITHOUT_CUDA();
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(5);
    Transformer plain(small_transformer_args());
    torch::manual_seed(5);
    Transformer model(small_transformer_args());
    auto options = FullyShardOptions().device_id(kGpu).auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>());
    auto root = fully_shard(model, options);
    for (const auto& p : root->parameters()) EXPECT_TRUE(p.is_cuda());
    const auto actual = full_values_on_the_cpu(*root);
    for (const auto& p : plain->named_parameters()) EXPECT_TRUE(at::equal(actual.at(p.key()), p.value())) << p.key();
    expect_step_like_the_plain_model(ctx, *root, [&](const at::Tensor& t) { return root->forward(t); }, plain);

    // A unit's buffers move with it.
    FullyShardedDataParallel<torch::nn::SequentialImpl> normed(
        torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4)), FullyShardOptions().device_id(kGpu));
    for (const auto& b : normed->named_buffers()) EXPECT_TRUE(b.value().is_cuda()) << b.key();
    EXPECT_TRUE(normed->forward(torch::randn({6, 4})).is_cuda());
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(CudaDeferredInit);

}  // namespace
}  // namespace fsdpp
