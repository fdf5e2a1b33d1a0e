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

// The most the GPU holds beyond the shards at wrapping or materialization: one unit's compute
// buffer (its views rebound), in the caching allocator's 512-byte blocks.
int64_t one_unit_on_the_gpu(torch::nn::Module& root, int64_t element_size) {
  int64_t largest = 0;
  for (FSDPModule* unit : fsdp_units(root)) largest = std::max(largest, unit->unsharded_padded_numel() * element_size);
  return (largest + 511) / 512 * 512;
}

// Every parameter a float32 shard on the GPU, with the plain model's values.
void expect_gpu_shards_of(torch::nn::Module& root, const std::map<std::string, at::Tensor>& expected) {
  for (const auto& p : root.parameters()) {
    EXPECT_TRUE(p.is_cuda());
    EXPECT_EQ(p.scalar_type(), at::kFloat);
  }
  const auto actual = full_values_on_the_cpu(root);
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, v] : expected) EXPECT_TRUE(at::equal(actual.at(name), v)) << name;
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
    // sees one unit's compute buffer for a moment, never the model.
    EXPECT_LE(memory_stats(kGpu).peak_bytes - shards, one_unit_on_the_gpu(*root, 4));
    EXPECT_EQ(memory_stats(kGpu).current_bytes, shards);
    EXPECT_FALSE(has_deferred_tensors(*root));
    expect_gpu_shards_of(*root, expected);
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
    reset_peak_memory_stats(kGpu);
    auto root = fully_shard(model, options);
    // Each unit sharded from the host: the GPU never held the model (moving it first, then
    // sharding, would peak at the model plus its shards).
    const MemoryStats wrapped = memory_stats(kGpu);
    EXPECT_LE(wrapped.peak_bytes - wrapped.current_bytes, one_unit_on_the_gpu(*root, 4));
    expect_gpu_shards_of(*root, full_values_on_the_cpu(*plain));
    expect_step_like_the_plain_model(ctx, *root, [&](const at::Tensor& t) { return root->forward(t); }, plain);

    // A unit's buffers move with it.
    FullyShardedDataParallel<torch::nn::SequentialImpl> normed(
        torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4)), FullyShardOptions().device_id(kGpu));
    for (const auto& b : normed->named_buffers()) EXPECT_TRUE(b.value().is_cuda()) << b.key();
    EXPECT_TRUE(normed->forward(torch::randn({6, 4})).is_cuda());
  });
}

// sync_module_states with device_id: rank 0 alone builds the model (on the CPU), the others
// deferred; every rank's GPU shards get rank 0's values. Then a deferred model under bf16 compute
// (materialize's host buffer in the parameters' float32, the compute buffer bf16): the CPU
// materialization's values.
TEST_P(CudaDeferredInit, SyncModuleStatesAndBfloat16Compute) {
  FSDPP_SKIP_WITHOUT_CUDA();
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto options = FullyShardOptions()
                       .device_id(kGpu)
                       .mp_policy(MixedPrecisionPolicy().param_dtype(at::kBFloat16))
                       .auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>());
    torch::manual_seed(5);
    Transformer plain(small_transformer_args());
    torch::manual_seed(5);
    Transformer from_rank0 = ctx.rank == 0 ? Transformer(small_transformer_args())
                                           : deferred_init([] { return Transformer(small_transformer_args()); });
    auto synced = fully_shard(from_rank0, FullyShardOptions(options).sync_module_states(true));
    expect_gpu_shards_of(*synced, full_values_on_the_cpu(*plain));

    Transformer reference = deferred_init([] { return Transformer(small_transformer_args()); });
    materialize_module(*reference, transformer_init_options(3));
    auto root = fully_shard(deferred_init([] { return Transformer(small_transformer_args()); }), options);
    materialize_module(*root, transformer_init_options(3));
    expect_gpu_shards_of(*root, full_values_on_the_cpu(*reference));
    EXPECT_TRUE(root->forward(torch::randint(40, {2, 8})).is_cuda());
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(CudaDeferredInit);

}  // namespace
}  // namespace fsdpp
