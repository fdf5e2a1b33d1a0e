// HSDP and FSDP x tensor parallelism with both models on the GPU (tier 2 of issue 37): four ranks
// sharing one GPU over Gloo, a 2 x 2 mesh, at parity with DDP of the plain model on the GPU, with
// the CPU tests' loops (tests/dist/hsdp_fixtures.h: seed 001's TestFullyShardHSDPTraining;
// tests/dist/fully_shard_2d_fixtures.h: its TestFullyShard2DTraining). HSDP's replicate all-reduce
// is chained after the shard group's reduce-scatter on another group's stream, so this is where a
// missing wait between the two streams would show. What it cannot show: NCCL (one rank per GPU;
// test_cuda_fully_shard.cpp runs NCCL at world size 1). The 2-D loop's bounds are the CPU's
// (measured there) times 10, not yet measured on a GPU. Skipped where no GPU is seen.
#include <gtest/gtest.h>

#include "dist/fully_shard_2d_fixtures.h"
#include "dist/hsdp_fixtures.h"
#include "gpu/gpu_fixtures.h"

namespace fsdpp {
namespace {

using testing::kGpu;

// Reshard after forward or not, an even and an uneven MLP dimension, gradient sync at the last
// microbatch; then reduce-scatter-only accumulation (all-reduce at the last microbatch only).
TEST(CudaHsdp, TrainParity2x2OverGlooOnOneGpu) {
  FSDPP_SKIP_WITHOUT_CUDA();
  run_ranks(4, [](RankContext& ctx) {
    const auto options = FullyShardOptions().mesh(hsdp_mesh(ctx, 2, 2));
    std::vector<HSDPCase> cases;
    for (bool raf : {false, true})
      for (int64_t dim : {16, 17}) cases.push_back({raf, /*activation_checkpointing=*/false, dim, true, false, kGpu});
    cases.push_back({true, false, 16, true, /*reduce_scatter_only=*/true, kGpu});
    for (const auto& c : cases) {
      check_parity_with_ddp(ctx, options, 2, c);
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// (dp, tp) = 2 x 2: column- and row-wise Linears over tp, FSDP over dp, with and without
// activation checkpointing.
TEST(CudaTensorParallel, TrainParity2DOverGlooOnOneGpu) {
  FSDPP_SKIP_WITHOUT_CUDA();
  run_ranks(4, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
    for (bool raf : {false, true})
      for (bool ac : {false, true}) {
        Case2D c{raf, ac, 17};
        c.device = kGpu;
        c.tolerance_scale = 10;
        check_2d_parity(mesh["dp"], mesh["tp"], c);
        if (::testing::Test::HasFailure()) return;
      }
  });
}

}  // namespace
}  // namespace fsdpp
