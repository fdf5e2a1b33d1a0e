// Seed 003 (PyTorch's test_fsdp_model_state.py): an FSDP model's SHARDED state dict saved with the
// distributed checkpoint and loaded into an FSDP model on the same ranks, or on two process
// groups of half the ranks (even and odd), which reshards on load. Values are only copied, so
// they must be equal bitwise.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <fsdpp/checkpoint.h>
#include <fsdpp/collectives.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/state_dict.h>

#include "dist/world_sizes.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

namespace ckpt = checkpoint;
using testing::RankContext;
using FSDPLinear = FullyShardedDataParallel<torch::nn::LinearImpl>;

std::map<std::string, at::Tensor> full_values(FSDPLinear& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, value] : get_model_state_dict(model, StateDictOptions().full_state_dict(true)))
    out[key] = value.tensor().clone();
  return out;
}

void fsdp_model_state(RankContext& ctx, const ProcessGroup& group) {
  const std::string dir = ctx.temp_dir + "/ckpt";
  torch::manual_seed(0);
  FSDPLinear model(torch::nn::Linear(8, 8));
  torch::manual_seed(ctx.rank + 100);
  model->forward(torch::rand({8, 8})).sum().backward();
  {
    auto scope = state_dict_type(*model.ptr(), StateDictType::SHARDED_STATE_DICT);
    StateDict sd = state_dict(model);
    EXPECT_TRUE(sd.at("weight").is_sharded());
    ckpt::State state = ckpt::to_state(sd, "model.");
    ckpt::save(state, dir);
  }
  const auto saved = full_values(model);

  torch::manual_seed(1);  // another initialisation
  FSDPLinear model_2(torch::nn::Linear(8, 8), FullyShardOptions().process_group(group));
  auto before = full_values(model_2);
  EXPECT_FALSE(at::equal(before.at("weight"), saved.at("weight")));
  EXPECT_FALSE(at::equal(before.at("bias"), saved.at("bias")));
  {
    auto scope = state_dict_type(*model_2.ptr(), StateDictType::SHARDED_STATE_DICT);
    StateDict sd2 = state_dict(model_2);
    ckpt::State state = ckpt::to_state(sd2, "model.");
    ckpt::load(state, dir);  // fills sd2's shards
    load_state_dict(model_2, sd2);
  }
  const auto loaded = full_values(model_2);
  for (const auto& [key, value] : saved) EXPECT_TRUE(at::equal(loaded.at(key), value)) << key;
  barrier(ctx.world);
}

class CheckpointFsdp : public testing::WorldSizeTest {};

TEST_P(CheckpointFsdp, FsdpModelStateNoResharding) {
  testing::run_ranks(GetParam(), [](RankContext& ctx) { fsdp_model_state(ctx, ctx.world); });
}
FSDPP_INSTANTIATE_WORLD_SIZES(CheckpointFsdp);

TEST(CheckpointFsdp4Ranks, FsdpModelStateWithResharding) {
  testing::run_ranks(4, [](RankContext& ctx) {
    ProcessGroup evens = ctx.world.new_group({0, 2});
    ProcessGroup odds = ctx.world.new_group({1, 3});
    fsdp_model_state(ctx, ctx.rank % 2 ? odds : evens);
  });
}

// The StateDict overloads: save(sd) / load(sd) with plain keys, into a model at another world size.
TEST(CheckpointFsdp4Ranks, StateDictOverloadsReshard4To3) {
  testing::run_ranks(4, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    torch::manual_seed(0);
    FSDPLinear model(torch::nn::Linear(10, 5));
    {
      auto scope = state_dict_type(*model.ptr(), StateDictType::SHARDED_STATE_DICT);
      ckpt::save(state_dict(model), dir);
    }
    const auto saved = full_values(model);
    ProcessGroup three = ctx.world.new_group({0, 1, 2});
    if (ctx.rank < 3) {
      torch::manual_seed(5);
      FSDPLinear model_3(torch::nn::Linear(10, 5), FullyShardOptions().process_group(three));
      auto scope = state_dict_type(*model_3.ptr(), StateDictType::SHARDED_STATE_DICT);
      StateDict sd = state_dict(model_3);
      ckpt::load(sd, dir);
      load_state_dict(model_3, sd);
      auto loaded = full_values(model_3);
      for (const auto& [key, value] : saved) EXPECT_TRUE(at::equal(loaded.at(key), value)) << key;
    }
    barrier(ctx.world);
  });
}

}  // namespace
}  // namespace fsdpp
