// FSDP with its parameters on a CUDA device, at parity with the plain model trained on the same
// GPU (seed 001's multi-group scenario: two inner units and the root, reshard_after_forward
// True / False / 2, SGD and Adam, with the seed's rank-dependent delays before the all-gathers
// and reduce-scatters that reorder the ranks' collectives): 1-4 ranks sharing one GPU over Gloo
// (tier 2 of issue 37), and one rank over NCCL (tier 3). Skipped where no GPU is seen.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "dist/fsdp_test_util.h"
#include "harness/cuda_devices.h"

namespace fsdpp {
namespace {

const at::Device kGpu(at::kCUDA, 0);

void expect_train_parity_on_the_gpu(RankContext& ctx) {
  for (const auto& [options, raf] : reshard_after_forward_sweep(ctx.world_size))
    for (Optim optim : {Optim::kSGD, Optim::kAdam}) {
      ParityCase c;
      c.optim = optim;
      c.steps = 6;
      if (optim == Optim::kAdam) c.delays(2 | 4);  // before every all-gather and reduce-scatter
      // make_multi_group's modules in its order (the same initial values), moved to the GPU
      // before wrapping: a unit shards the device its parameters are on.
      torch::manual_seed(42);
      Sequential ref = make_multi_group(false, options);
      ref->to(kGpu);
      torch::manual_seed(42);
      Linear l1(7, 15), l2(15, 15), l3(15, 3);
      for (Linear* l : {&l1, &l2, &l3}) (*l)->to(kGpu);
      FSDPSequential model(Sequential(FSDPLinear(l1, options), ReLU(), FSDPLinear(l2, options), ReLU(), l3), options);
      for (const auto& p : model->parameters()) ASSERT_TRUE(p.is_cuda()) << "a shard left the GPU";
      const std::string label = raf + " " + c.delays_name() + " on " + kGpu.str();
      check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x.to(kGpu)).cpu(); }, *model,
                         [&](const at::Tensor& x) { return model->forward(x.to(kGpu)).cpu(); }, 7, 3, c, label);
      if (::testing::Test::HasFailure()) return;
    }
}

class CudaFullyShard : public testing::WorldSizeTest {};

TEST_P(CudaFullyShard, TrainParityOverGlooOnOneGpu) {
  FSDPP_SKIP_WITHOUT_CUDA();
  run_ranks(GetParam(), [](RankContext& ctx) { expect_train_parity_on_the_gpu(ctx); });
}

TEST(CudaFullyShardNccl, TrainParityAtWorldSizeOne) {
  FSDPP_SKIP_WITHOUT_CUDA();
  testing::RunOptions options;
  options.backend = "nccl";
  run_ranks(1, [](RankContext& ctx) { expect_train_parity_on_the_gpu(ctx); }, options);
}

FSDPP_INSTANTIATE_WORLD_SIZES(CudaFullyShard);

}  // namespace
}  // namespace fsdpp
