// A distributed checkpoint of an FSDP model and its Adam state on the GPU (issue 37's "written on
// GPU and loaded on CPU and back"): saved from CUDA shards, loaded into the same model on the CPU
// and into a fresh one on the GPU, each then equal to the saved model's full state dict, and the
// GPU copy training on as the original does. 1-4 ranks sharing one GPU over Gloo. Skipped where
// no GPU is seen.
#include <gtest/gtest.h>

#include <map>

#include <torch/torch.h>

#include <fsdpp/checkpoint.h>
#include <fsdpp/state_dict.h>

#include "gpu/gpu_fixtures.h"

namespace fsdpp {
namespace {

using testing::kGpu;
using testing::multi_group_on_the_gpu;

// One Adam step of `model` on this rank's slice of a fixed batch; returns the global loss.
double train_step(FSDPSequential& model, torch::optim::Optimizer& opt, int step, const RankContext& ctx,
                  const at::Device& device) {
  const int64_t local = kGlobalBatch / ctx.world_size;
  torch::manual_seed(1000 + step);
  const at::Tensor x = torch::randn({kGlobalBatch, 7}).narrow(0, ctx.rank * local, local).to(device);
  const at::Tensor y = torch::randn({kGlobalBatch, 3}).narrow(0, ctx.rank * local, local).to(device);
  opt.zero_grad();
  at::Tensor loss = (model->forward(x) - y).pow(2).mean();
  loss.backward();
  opt.step();
  at::Tensor global = loss.detach().cpu();
  all_reduce(global, ReduceOp::AVG);
  return global.item<double>();
}

std::map<std::string, at::Tensor> full_state(FSDPSequential& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, v] : get_model_state_dict(model, StateDictOptions().full_state_dict(true)))
    out[key] = v.tensor().detach().cpu().clone();
  return out;
}

void expect_same_state(FSDPSequential& model, const std::map<std::string, at::Tensor>& expected, const std::string& what) {
  const auto actual = full_state(model);
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (const auto& [key, t] : expected) EXPECT_TRUE(at::equal(actual.at(key), t)) << what << ": " << key;
}

void expect_checkpoint_between_gpu_and_cpu(RankContext& ctx) {
  const std::string dir = ctx.temp_dir + "/ckpt";
  FSDPSequential model = multi_group_on_the_gpu(FullyShardOptions());
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 2; ++step) train_step(model, opt, step, ctx, kGpu);
  const auto saved = full_state(model);
  checkpoint::State state = checkpoint::to_state(get_model_state_dict(model), "model.");
  state.merge(checkpoint::to_state(get_optimizer_state_dict(model, opt), "optim."));
  checkpoint::save(state, dir);

  torch::manual_seed(7);  // other initial values, replaced by the load
  FSDPSequential on_cpu(make_multi_group(true, FullyShardOptions()), FullyShardOptions());
  torch::optim::Adam cpu_opt(on_cpu->parameters(), torch::optim::AdamOptions(1e-2));
  load_checkpoint(*on_cpu, cpu_opt, dir);
  for (const auto& p : on_cpu->parameters()) EXPECT_TRUE(p.is_cpu());
  expect_same_state(on_cpu, saved, "loaded on the CPU");

  FSDPSequential back = multi_group_on_the_gpu(FullyShardOptions());
  torch::optim::Adam back_opt(back->parameters(), torch::optim::AdamOptions(1e-2));
  load_checkpoint(*back, back_opt, dir);
  for (const auto& p : back->parameters()) EXPECT_TRUE(p.is_cuda());
  expect_same_state(back, saved, "loaded back on the GPU");
  // The optimizer's state came back too, on the parameters' device: the next steps agree.
  for (int step = 2; step < 4; ++step) {
    const double resumed = train_step(back, back_opt, step, ctx, kGpu);
    const double original = train_step(model, opt, step, ctx, kGpu);
    EXPECT_NEAR(resumed, original, 1e-6 * std::abs(original)) << "step " << step;
  }
}

class CudaCheckpoint : public testing::WorldSizeTest {};

FSDPP_GPU_TEST_P(CudaCheckpoint, WrittenOnTheGpuLoadedOnTheCpuAndBack, expect_checkpoint_between_gpu_and_cpu)

FSDPP_INSTANTIATE_WORLD_SIZES(CudaCheckpoint);

}  // namespace
}  // namespace fsdpp
