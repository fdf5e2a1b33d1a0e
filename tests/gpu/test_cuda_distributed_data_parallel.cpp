// DDP with its module on a CUDA device: 1-4 ranks sharing one GPU over Gloo, one rank over NCCL,
// at parity with the plain model trained on the global batch on the same GPU (rank 0's initial
// values broadcast to every rank, buckets of 100 floats so that the gradients travel in several
// all-reduces issued during backward). Skipped where no GPU is seen.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <fsdpp/distributed_data_parallel.h>

#include "gpu/gpu_fixtures.h"

namespace fsdpp {
namespace {

using testing::kGpu;

void expect_ddp_parity_on_the_gpu(RankContext& ctx) {
  const int n = ctx.world_size, rank = ctx.rank;
  const Shapes shapes{{16, 15}, {15, 8}};
  torch::manual_seed(0);
  Sequential ref = make_mlp(shapes);
  ref->to(kGpu);
  torch::manual_seed(rank);  // each rank's own values: DDP broadcasts rank 0's
  Sequential local = make_mlp(shapes);
  local->to(kGpu);
  DistributedDataParallel<torch::nn::SequentialImpl> ddp(
      local, DistributedDataParallelOptions().bucket_cap_mb(100 * 4 / (1024.0 * 1024.0)));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD opt(local->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const int64_t slice = kGlobalBatch / n;
  for (int step = 0; step < 5; ++step) {
    const std::string where = "step " + std::to_string(step) + " on " + kGpu.str();
    torch::manual_seed(1000 + step);
    const at::Tensor x = torch::randn({kGlobalBatch, 16}).to(kGpu), y = torch::randn({kGlobalBatch, 8}).to(kGpu);
    ref_opt.zero_grad();
    opt.zero_grad();
    (ref->forward(x) - y).pow(2).mean().backward();
    (ddp.forward(x.narrow(0, rank * slice, slice)) - y.narrow(0, rank * slice, slice)).pow(2).mean().backward();
    const auto ref_params = ref->parameters(), params = local->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(params[i].grad().is_cuda()) << where;
      expect_close(params[i].grad(), ref_params[i].grad(), where + " grad " + std::to_string(i));
    }
    ref_opt.step();
    opt.step();
    for (size_t i = 0; i < params.size(); ++i)
      expect_close(params[i].detach(), ref_params[i].detach(), where + " param " + std::to_string(i));
    if (::testing::Test::HasFailure()) return;
  }
}

class CudaDistributedDataParallel : public testing::WorldSizeTest {};

FSDPP_GPU_TEST_P(CudaDistributedDataParallel, TrainParityOverGlooOnOneGpu, expect_ddp_parity_on_the_gpu)

FSDPP_GPU_NCCL_TEST(CudaDistributedDataParallelNccl, TrainParityAtWorldSizeOne, expect_ddp_parity_on_the_gpu)

FSDPP_INSTANTIATE_WORLD_SIZES(CudaDistributedDataParallel);

}  // namespace
}  // namespace fsdpp
