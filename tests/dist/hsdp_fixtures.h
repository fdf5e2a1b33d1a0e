#pragma once
// What the HSDP tests share (seed 001's TestFullyShardHSDPTraining in test_fully_shard_hsdp.cpp,
// and tests/gpu/test_cuda_hsdp_and_tp.cpp on a GPU): the seed's model (a LayerNorm in the root
// and three MLPs, each its own unit), its 2-D (replicate, shard) mesh, and the seed's training
// loop against DDP of the plain model over the world.
#include <initializer_list>
#include <string>
#include <vector>

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/distributed_data_parallel.h>

#include "dist/fsdp_test_util.h"

namespace fsdpp {

// The seed's model: a LayerNorm (in the root) and three MLPs, each its own unit.
struct HSDPCase {
  bool reshard_after_forward = true;
  bool activation_checkpointing = false;
  int64_t mlp_dim = 16;
  bool sync_gradients_at_last_batch = true;
  // Seed 001's reduce_scatter_only: every microbatch reduce-scatters, only the last all-reduces
  // across replicas (set_requires_all_reduce instead of set_requires_gradient_sync).
  bool reduce_scatter_only = false;
  at::Device device = at::kCPU;  // where both models compute (tests/gpu: a CUDA device)
};

inline std::string describe(const HSDPCase& c) {
  return "reshard_after_forward " + std::to_string(c.reshard_after_forward) + " ac " +
         std::to_string(c.activation_checkpointing) + " mlp_dim " + std::to_string(c.mlp_dim) + " sync_at_last " +
         std::to_string(c.sync_gradients_at_last_batch) + (c.reduce_scatter_only ? " reduce_scatter_only" : "") +
         (c.device.is_cpu() ? "" : " on " + c.device.str());
}

inline Sequential make_hsdp_plain(int64_t dim) {
  torch::manual_seed(42);
  return Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})), MLP(dim, 3 * dim), MLP(dim, 4 * dim),
                    MLP(dim, 3 * dim));
}

// make_hsdp_plain's model on `device` with each MLP a unit (checkpointed inside it when asked) and the
// root.
inline FSDPSequential make_hsdp_sharded(int64_t dim, const FullyShardOptions& options, bool activation_checkpointing,
                                   const at::Device& device = at::kCPU) {
  Sequential plain = make_hsdp_plain(dim);
  plain->to(device);
  Sequential seq;
  seq->push_back(plain->ptr<torch::nn::LayerNormImpl>(0));
  for (size_t i = 1; i < plain->size(); ++i) {
    auto mlp = plain->ptr<MLPImpl>(i);
    if (activation_checkpointing)
      seq->push_back(fully_shard(checkpoint_wrapper(mlp), options));
    else
      seq->push_back(fully_shard(mlp, options));
  }
  return FSDPSequential(seq, options);
}

// Trains the HSDP model and DDP (on the world group, the reference) on the same per-rank data:
// 5 iterations of 3 microbatches, gradient sync only at the last microbatch when asked. Losses,
// gradient shards and parameter shards match the reference's rows of this rank's shard. The
// gradient shards are compared after each iteration's backward, before the step: under Adam the
// losses and parameters barely move when every gradient is scaled alike, so they alone would not
// tell a sum over the replicate or shard group from the average (with either summing, the
// gradients fail at the first iteration).
inline void check_parity_with_ddp(RankContext& ctx, const FullyShardOptions& options, int shard_size, const HSDPCase& c) {
  const std::string label = describe(c);
  const int shard_rank = ctx.rank % shard_size;
  auto ref_module = make_hsdp_plain(c.mlp_dim);
  ref_module->to(c.device);
  auto ref = replicate(ref_module);
  FSDPSequential model =
      make_hsdp_sharded(c.mlp_dim, FullyShardOptions(options).reshard_after_forward(c.reshard_after_forward),
                   c.activation_checkpointing, c.device);
  auto ref_params = ref_module->parameters();
  auto params = model->parameters();
  ASSERT_EQ(params.size(), ref_params.size());
  auto check_shards = [&](const std::string& where, bool grads) {
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& expected = grads ? ref_params[i].grad() : ref_params[i];
      const at::Tensor& actual = grads ? params[i].grad() : params[i];
      expect_close(actual.detach(), shard_rows(expected.detach(), shard_rank, shard_size),
                   where + (grads ? " grad " : " param ") + std::to_string(i));
    }
  };
  check_shards(label + " init", false);
  torch::optim::Adam ref_opt(ref_params, 1e-2), opt(params, 1e-2);
  torch::manual_seed(42 + ctx.rank + 1);
  for (int iter = 0; iter < 5; ++iter) {
    const std::string where = label + " iter " + std::to_string(iter);
    for (int micro = 0; micro < 3; ++micro) {
      if (c.reduce_scatter_only)
        model->set_requires_all_reduce(micro == 2);
      else if (c.sync_gradients_at_last_batch)
        model->set_requires_gradient_sync(micro == 2);
      at::Tensor x = torch::randn({8, c.mlp_dim}).to(c.device);
      at::Tensor ref_loss = ref.forward(x).sum();
      ref_loss.backward();
      CommDebugMode comm;
      at::Tensor loss = model->forward(x).sum();
      loss.backward();
      if (c.reduce_scatter_only) {
        EXPECT_EQ(comm.count("reduce_scatter_tensor"), 4) << where;
        EXPECT_EQ(comm.count("all_reduce"), micro == 2 && shard_size < ctx.world_size ? 4 : 0) << where;
      }
      EXPECT_TRUE(at::allclose(loss, ref_loss, 1e-5, 1e-4)) << where << " micro " << micro << ": " << loss.item<float>()
                                                           << " vs " << ref_loss.item<float>();
    }
    check_shards(where, true);
    ref_opt.step();
    opt.step();
    for (auto* o : std::initializer_list<torch::optim::Optimizer*>{&ref_opt, &opt}) {
      if (iter % 2 == 0) {
        for (auto& p : o->parameters()) p.mutable_grad().reset();
      } else {
        o->zero_grad();
      }
    }
    check_shards(where, false);
    if (::testing::Test::HasFailure()) return;
  }
}

inline std::vector<HSDPCase> seed_sweep() {
  std::vector<HSDPCase> cases;
  for (bool raf : {false, true})
    for (bool ac : {false, true})
      for (int64_t dim : {3, 16, 17})
        for (bool sync_last : {true, false}) cases.push_back({raf, ac, dim, sync_last});
  return cases;
}

inline DeviceMesh hsdp_mesh(RankContext& ctx, int replicate_size, int shard_size) {
  return init_device_mesh(ctx.world, {replicate_size, shard_size}, {"replicate", "shard"});
}

}  // namespace fsdpp
