// FSDP with its parameters on a CUDA device, at parity with the plain model trained on the same
// GPU (seed 001's multi-group scenario: two inner units and the root, reshard_after_forward
// True / False / 2, SGD and Adam, with the seed's rank-dependent delays before the all-gathers
// and reduce-scatters that reorder the ranks' collectives): 1-4 ranks sharing one GPU over Gloo
// (tier 2 of issue 37), and one rank over NCCL (tier 3); CPU offload to pinned host memory with
// the GPU computing, and bfloat16 compute. Skipped where no GPU is seen.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "gpu/gpu_fixtures.h"

namespace fsdpp {
namespace {

using testing::kGpu;
using testing::multi_group_on_the_gpu;

void expect_train_parity_on_the_gpu(RankContext& ctx) {
  for (const auto& [options, raf] : reshard_after_forward_sweep(ctx.world_size))
    for (Optim optim : {Optim::kSGD, Optim::kAdam}) {
      ParityCase c;
      c.optim = optim;
      c.steps = 6;
      if (optim == Optim::kAdam) c.delays(2 | 4);  // before every all-gather and reduce-scatter
      torch::manual_seed(42);
      Sequential ref = make_multi_group(false, options);
      ref->to(kGpu);
      FSDPSequential model = multi_group_on_the_gpu(options);
      for (const auto& p : model->parameters()) ASSERT_TRUE(p.is_cuda()) << "a shard left the GPU";
      const std::string label = raf + " " + c.delays_name() + " on " + kGpu.str();
      check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x.to(kGpu)).cpu(); }, *model,
                         [&](const at::Tensor& x) { return model->forward(x.to(kGpu)).cpu(); }, 7, 3, c, label);
      if (::testing::Test::HasFailure()) return;
    }
}

// Trains `model` (on this rank's slice) beside the plain model on the GPU (on the global batch),
// 4 Adam steps; `check` sees each step's loss of both and the model's parameters after backward.
template <typename Check>
void train_beside_the_plain_model(RankContext& ctx, FSDPSequential& model, const FullyShardOptions& options,
                                  Check&& check) {
  const int n = ctx.world_size, rank = ctx.rank;
  const int64_t local = kGlobalBatch / n;
  torch::manual_seed(42);
  Sequential ref = make_multi_group(false, options);
  ref->to(kGpu);
  auto ref_opt = make_optimizer(Optim::kAdam, ref->parameters());
  auto opt = make_optimizer(Optim::kAdam, model->parameters());
  for (int step = 0; step < 4; ++step) {
    torch::manual_seed(1000 + step);
    const at::Tensor x = torch::randn({kGlobalBatch, 7}).to(kGpu), y = torch::randn({kGlobalBatch, 3}).to(kGpu);
    ref_opt->zero_grad();
    opt->zero_grad();
    at::Tensor ref_loss = (ref->forward(x) - y).pow(2).mean();
    ref_loss.backward();
    at::Tensor loss = (model->forward(x.narrow(0, rank * local, local)) - y.narrow(0, rank * local, local)).pow(2).mean();
    loss.backward();
    at::Tensor global_loss = loss.detach().to(at::kFloat).cpu();
    all_reduce(global_loss, ReduceOp::AVG);
    check(step, global_loss, ref_loss.detach().cpu(), *ref);
    ref_opt->step();
    opt->step();
    if (::testing::Test::HasFailure()) return;
  }
}

// CPUOffloadPolicy with the GPU computing: shards, their gradients and the optimizer's state in
// pinned host memory, each gather copying the shards to the GPU and each reduced gradient coming
// back; training at parity with the plain model on the GPU.
void expect_offload_parity_on_the_gpu(RankContext& ctx) {
  const auto offloaded = FullyShardOptions().offload_policy(CPUOffloadPolicy());
  FSDPSequential model = multi_group_on_the_gpu(offloaded);
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(p.value().is_cpu()) << p.key();
    EXPECT_TRUE(p.value().is_pinned()) << p.key();
  }
  train_beside_the_plain_model(ctx, model, offloaded, [&](int step, const at::Tensor& loss, const at::Tensor& ref_loss,
                                                          torch::nn::Module& ref) {
    const std::string where = "offload step " + std::to_string(step);
    expect_close(loss, ref_loss, where + " loss");
    const auto ref_params = ref.parameters(), params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(params[i].grad().is_cpu()) << where << " grad " << i;
      expect_close(params[i].grad(), shard_rows(ref_params[i].grad(), ctx.rank, ctx.world_size).cpu(),
                   where + " grad " + std::to_string(i));
    }
  });
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.is_cpu() && p.is_pinned()) << "after the optimizer's steps";
}

// bfloat16 compute, float32 reduction (FSDP2's usual policy) against the float32 plain model:
// losses within bfloat16's resolution, gradients in float32 on the GPU.
void expect_bf16_training_near_float32_on_the_gpu(RankContext& ctx) {
  const auto bf16 = FullyShardOptions().mp_policy(MixedPrecisionPolicy().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat));
  FSDPSequential model = multi_group_on_the_gpu(bf16);
  train_beside_the_plain_model(ctx, model, bf16, [&](int step, const at::Tensor& loss, const at::Tensor& ref_loss,
                                                     torch::nn::Module&) {
    EXPECT_TRUE(at::allclose(loss, ref_loss, 2e-2, 1e-2))
        << "bf16 step " << step << ": loss " << loss.item<double>() << ", float32 " << ref_loss.item<double>();
    for (const auto& p : model->parameters()) {
      EXPECT_TRUE(p.is_cuda());
      EXPECT_EQ(p.scalar_type(), at::kFloat);
      EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
    }
  });
}

class CudaFullyShard : public testing::WorldSizeTest {};

FSDPP_GPU_TEST_P(CudaFullyShard, CpuOffloadWithTheGpuComputing, expect_offload_parity_on_the_gpu)

FSDPP_GPU_TEST_P(CudaFullyShard, Bfloat16ComputeNearFloat32, expect_bf16_training_near_float32_on_the_gpu)

FSDPP_GPU_TEST_P(CudaFullyShard, TrainParityOverGlooOnOneGpu, expect_train_parity_on_the_gpu)

FSDPP_GPU_NCCL_TEST(CudaFullyShardNccl, TrainParityAtWorldSizeOne, expect_train_parity_on_the_gpu)

FSDPP_INSTANTIATE_WORLD_SIZES(CudaFullyShard);

}  // namespace
}  // namespace fsdpp
