// What else issue 37 names on device tensors, against the plain model: a FULL state dict of a
// GPU FSDP model and its load with broadcast_from_rank0 into another; clip_grad_norm_ over GPU
// shards; export_safetensors from the GPU; ZeroRedundancyOptimizer stepping GPU parameters like
// Adam on the whole model. 1-4 ranks sharing one GPU over Gloo. Skipped where no GPU is seen.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include <torch/torch.h>

#include <fsdpp/checkpoint.h>
#include <fsdpp/clip_grad_norm.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/zero_redundancy_optimizer.h>

#include "gpu/gpu_fixtures.h"

namespace fsdpp {
namespace {

using testing::kGpu;
using testing::multi_group_on_the_gpu;

// The plain model multi_group_on_the_gpu starts from, on the CPU.
Sequential plain_multi_group() {
  torch::manual_seed(42);
  return make_multi_group(false, FullyShardOptions());
}

// Forward and backward on this rank's slice of a fixed batch (the plain model: the whole batch).
void backward_on_a_batch(torch::nn::Module& model, const std::function<at::Tensor(const at::Tensor&)>& forward, int rank,
                         int n, const at::Device& device) {
  torch::manual_seed(1000);
  const int64_t local = kGlobalBatch / n;
  const at::Tensor x = torch::randn({kGlobalBatch, 7}).narrow(0, rank * local, local).to(device);
  const at::Tensor y = torch::randn({kGlobalBatch, 3}).narrow(0, rank * local, local).to(device);
  model.zero_grad();
  (forward(x) - y).pow(2).mean().backward();
}

void expect_state_dicts_on_the_gpu(RankContext& ctx) {
  Sequential plain = plain_multi_group();
  FSDPSequential model = multi_group_on_the_gpu(FullyShardOptions());
  const StateDict full = get_model_state_dict(model, StateDictOptions().full_state_dict(true));
  for (const auto& p : plain->named_parameters()) expect_close(full.at(p.key()).tensor().cpu(), p.value(), p.key());
  // Another GPU model, other values: rank 0's dict (its tensors on the GPU, the others' empty)
  // reaches every rank through host memory and lands in the GPU shards.
  torch::manual_seed(7);
  Linear l1(7, 15), l2(15, 15), l3(15, 3);
  for (Linear* l : {&l1, &l2, &l3}) (*l)->to(kGpu);
  const FullyShardOptions options;
  FSDPSequential other(Sequential(FSDPLinear(l1, options), ReLU(), FSDPLinear(l2, options), ReLU(), l3), options);
  set_model_state_dict(other, ctx.rank == 0 ? full : StateDict(),
                       StateDictOptions().full_state_dict(true).broadcast_from_rank0(true));
  for (const auto& p : other->parameters()) EXPECT_TRUE(p.is_cuda());
  const StateDict loaded = get_model_state_dict(other, StateDictOptions().full_state_dict(true));
  for (const auto& p : plain->named_parameters()) expect_close(loaded.at(p.key()).tensor().cpu(), p.value(), p.key());
}

void expect_clip_and_export_on_the_gpu(RankContext& ctx) {
  Sequential plain = plain_multi_group();
  FSDPSequential model = multi_group_on_the_gpu(FullyShardOptions());
  backward_on_a_batch(*plain, [&](const at::Tensor& x) { return plain->forward(x); }, 0, 1, at::kCPU);
  backward_on_a_batch(*model, [&](const at::Tensor& x) { return model->forward(x); }, ctx.rank, ctx.world_size, kGpu);
  const double expected = torch::nn::utils::clip_grad_norm_(plain->parameters(), 0.1);
  const at::Tensor norm = clip_grad_norm_(*model, 0.1);
  EXPECT_TRUE(norm.is_cuda());
  EXPECT_NEAR(norm.item<double>(), expected, 1e-5 * expected);
  // The gradient shards were scaled as the plain model's gradients were.
  const auto plain_params = plain->parameters(), params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().is_cuda()) << "grad " << i;
    expect_close(params[i].grad().cpu(), shard_rows(plain_params[i].grad(), ctx.rank, ctx.world_size),
                 "clipped grad " + std::to_string(i));
  }

  const std::string file = ctx.temp_dir + "/model.safetensors";
  checkpoint::export_safetensors(model, file);
  barrier();
  const auto written = checkpoint::load_safetensors(file);
  for (const auto& p : plain->named_parameters()) EXPECT_TRUE(at::equal(written.at(p.key()), p.value())) << p.key();
}

void expect_zero_like_adam_on_the_gpu(RankContext& /*every rank alike*/) {
  Sequential plain = plain_multi_group(), replica = plain_multi_group();
  replica->to(kGpu);
  torch::optim::Adam adam(plain->parameters(), torch::optim::AdamOptions(1e-2));
  ZeroRedundancyOptimizer<torch::optim::Adam> zero(replica->parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    // Each rank's replica gets the whole batch's gradient (as DDP would give it).
    backward_on_a_batch(*plain, [&](const at::Tensor& x) { return plain->forward(x); }, 0, 1, at::kCPU);
    backward_on_a_batch(*replica, [&](const at::Tensor& x) { return replica->forward(x); }, 0, 1, kGpu);
    adam.step();
    zero.step();
  }
  const auto expected = plain->parameters(), actual = replica->parameters();
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(actual[i].is_cuda());
    expect_close(actual[i].detach().cpu(), expected[i].detach(), "parameter " + std::to_string(i));
  }
}

class CudaStateDict : public testing::WorldSizeTest {};

FSDPP_GPU_TEST_P(CudaStateDict, FullStateDictAndBroadcastFromRank0, expect_state_dicts_on_the_gpu)

FSDPP_GPU_TEST_P(CudaStateDict, ClipGradNormAndExportSafetensors, expect_clip_and_export_on_the_gpu)

FSDPP_GPU_TEST_P(CudaStateDict, ZeroRedundancyOptimizerLikeAdam, expect_zero_like_adam_on_the_gpu)

FSDPP_INSTANTIATE_WORLD_SIZES(CudaStateDict);

}  // namespace
}  // namespace fsdpp
