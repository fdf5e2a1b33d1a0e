// fsdpp's collectives on CUDA tensors (tier 2 of issue 37: several ranks on one GPU over Gloo,
// which stages CUDA tensors through host memory; tier 3: one rank over NCCL) and the CUDA
// caching allocator's statistics. Compiled against every CUDA-enabled libtorch; skipped where no
// GPU is seen (scripts/run-gpu-tests.sh runs them on the accelerator machine).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <fsdpp/collectives.h>
#include <fsdpp/memory.h>
#include <fsdpp/process_group.h>

#include "gpu/gpu_fixtures.h"

namespace fsdpp {
namespace {

using testing::RankContext;

using testing::kGpu;

// Runs every collective on the same values as CUDA and as CPU tensors (values whose sums are exact,
// so any order of summation gives the same bits) and expects the same results. Outputs start as
// -1s, so that an out-of-place collective that wrote nothing (a no-op at world size 1) fails.
void expect_each_collective_as_on_the_cpu(RankContext& ctx) {
  const int n = ctx.world_size, r = ctx.rank;
  const at::Tensor base = at::arange(12, at::kFloat).add_(100 * r);
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX}) {
    at::Tensor cpu = base.clone(), gpu = base.to(kGpu);
    all_reduce(cpu, op, ctx.world);
    all_reduce(gpu, op, ctx.world);
    EXPECT_TRUE(at::equal(cpu, gpu.cpu())) << "all_reduce " << to_string(op);
  }
  {
    at::Tensor gpu = base.to(kGpu);
    broadcast(gpu, n - 1, ctx.world);
    EXPECT_TRUE(at::equal(gpu.cpu(), at::arange(12, at::kFloat).add_(100 * (n - 1)))) << "broadcast";
  }
  {
    at::Tensor cpu = at::full({n * 12}, -1.0f), gpu = at::full({n * 12}, -1.0f, kGpu);
    all_gather_into_tensor(cpu, base, ctx.world);
    all_gather_into_tensor(gpu, base.to(kGpu), ctx.world);
    EXPECT_TRUE(at::equal(cpu, gpu.cpu())) << "all_gather_into_tensor";
  }
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
    const at::Tensor input = at::arange(n * 4, at::kFloat).add_(r);
    at::Tensor cpu = at::full({4}, -1.0f), gpu = at::full({4}, -1.0f, kGpu);
    reduce_scatter_tensor(cpu, input, op, ctx.world);
    reduce_scatter_tensor(gpu, input.to(kGpu), op, ctx.world);
    EXPECT_TRUE(at::equal(cpu, gpu.cpu())) << "reduce_scatter_tensor " << to_string(op);
  }
  {
    const at::Tensor input = at::arange(n * 2, at::kFloat).add_(10 * r);
    at::Tensor cpu = at::full({n * 2}, -1.0f), gpu = at::full({n * 2}, -1.0f, kGpu);
    all_to_all_single(cpu, input, {}, {}, ctx.world);
    all_to_all_single(gpu, input.to(kGpu), {}, {}, ctx.world);
    EXPECT_TRUE(at::equal(cpu, gpu.cpu())) << "all_to_all_single";
  }
  {  // small integers, exact in bfloat16 and in its sums
    const at::Tensor small = at::arange(12, at::kFloat).add_(r).to(at::kBFloat16);
    at::Tensor cpu = small.clone(), gpu = small.to(kGpu);
    all_reduce(cpu, ReduceOp::SUM, ctx.world);
    all_reduce(gpu, ReduceOp::SUM, ctx.world);
    EXPECT_TRUE(at::equal(cpu, gpu.cpu())) << "all_reduce bfloat16";
    const at::Tensor input = at::arange(n * 4, at::kFloat).add_(r).to(at::kBFloat16);
    at::Tensor cpu_shard = at::full({4}, -1, at::kBFloat16), gpu_shard = at::full({4}, -1, input.options().device(kGpu));
    reduce_scatter_tensor(cpu_shard, input, ReduceOp::SUM, ctx.world);
    reduce_scatter_tensor(gpu_shard, input.to(kGpu), ReduceOp::SUM, ctx.world);
    EXPECT_TRUE(at::equal(cpu_shard, gpu_shard.cpu())) << "reduce_scatter_tensor bfloat16";
    at::Tensor cpu_all = at::full({n * 12}, -1, at::kBFloat16), gpu_all = at::full({n * 12}, -1, small.options().device(kGpu));
    all_gather_into_tensor(cpu_all, small, ctx.world);
    all_gather_into_tensor(gpu_all, small.to(kGpu), ctx.world);
    EXPECT_TRUE(at::equal(cpu_all, gpu_all.cpu())) << "all_gather_into_tensor bfloat16";
  }
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MAX}) {  // int16, which neither Gloo nor NCCL reduces itself
    at::Tensor cpu = at::arange(12, at::kShort).add_(r), gpu = cpu.to(kGpu);
    all_reduce(cpu, op, ctx.world);
    all_reduce(gpu, op, ctx.world);
    EXPECT_TRUE(at::equal(cpu, gpu.cpu())) << "all_reduce int16 " << to_string(op);
  }
  for (at::ScalarType dtype : {at::kShort, at::kUInt32}) {  // moved as bytes where NCCL lacks the dtype
    const at::Tensor small = at::arange(12, at::kLong).add_(r).to(dtype);
    at::Tensor cpu_all = at::full({n * 12}, 7, small.options()), gpu_all = at::full({n * 12}, 7, small.options().device(kGpu));
    all_gather_into_tensor(cpu_all, small, ctx.world);
    all_gather_into_tensor(gpu_all, small.to(kGpu), ctx.world);
    EXPECT_TRUE(at::equal(cpu_all.to(at::kLong), gpu_all.cpu().to(at::kLong))) << "all_gather_into_tensor " << dtype;
  }
  {  // MIN and MAX reduce-scatter, which some releases' Gloo summed
    const at::Tensor input = at::arange(n * 4, at::kFloat).mul_(r % 2 ? 1 : -1);
    at::Tensor cpu = at::full({4}, -1.0f), gpu = at::full({4}, -1.0f, kGpu);
    reduce_scatter_tensor(cpu, input, ReduceOp::MIN, ctx.world);
    reduce_scatter_tensor(gpu, input.to(kGpu), ReduceOp::MIN, ctx.world);
    EXPECT_TRUE(at::equal(cpu, gpu.cpu())) << "reduce_scatter_tensor MIN";
  }
}

// A collective reads what its issuing thread's stream wrote before the call, however long that
// stream's queue: the input is filled behind a spinning kernel on a side stream, so a collective
// that did not wait for it would reduce the zeros it held before.
void expect_collectives_wait_for_the_issuing_stream(RankContext& ctx) {
  const int n = ctx.world_size;
  c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool(false, 0));
  for (int i = 0; i < 4; ++i) {
    at::Tensor t = at::zeros({1 << 16}, kGpu);
    at::cuda::sleep(20 * 1000 * 1000);  // tens of milliseconds of GPU time
    t.fill_(ctx.rank + 1 + i);
    Work work = all_reduce(t, ReduceOp::SUM, ctx.world, /*async_op=*/true);
    work.wait();
    const double expected = n * (n + 1) / 2.0 + n * i;
    EXPECT_TRUE(at::equal(t.cpu(), at::full({1 << 16}, expected))) << "iteration " << i;
  }
}

class CudaCollectives : public testing::WorldSizeTest {};

TEST_P(CudaCollectives, OverGlooOnOneGpuAsOnTheCpu) {
  FSDPP_SKIP_WITHOUT_CUDA();
  testing::run_ranks(GetParam(), testing::with_delayed_collectives([](RankContext& ctx) {
    EXPECT_EQ(ctx.world.backend()->getBackend(c10::DeviceType::CUDA)->getBackendName(), "gloo");
    expect_each_collective_as_on_the_cpu(ctx);
    expect_collectives_wait_for_the_issuing_stream(ctx);
  }));
}

// NCCL refuses two ranks on one GPU: world size 1, under both of PyTorch's spellings.
TEST(CudaNccl, WorldOfOneRunsEachCollective) {
  FSDPP_SKIP_WITHOUT_CUDA();
  for (const char* backend : {"nccl", "cpu:gloo,cuda:nccl"}) {
    testing::RunOptions options;
    options.backend = backend;
    testing::run_ranks(1, testing::with_delayed_collectives([backend](RankContext& ctx) {
      EXPECT_EQ(ctx.world.backend()->getBackend(c10::DeviceType::CUDA)->getBackendName(), "nccl") << backend;
      EXPECT_EQ(ctx.world.backend()->getBackend(c10::DeviceType::CPU)->getBackendName(), "gloo") << backend;
      expect_each_collective_as_on_the_cpu(ctx);
      expect_collectives_wait_for_the_issuing_stream(ctx);
    }), options);
  }
}

TEST(CudaMemoryStats, CountTheCachingAllocator) {
  FSDPP_SKIP_WITHOUT_CUDA();
  testing::RunOptions options;
  options.init_process_group = false;
  testing::run_ranks(1, [](RankContext&) {
    const int64_t mib = 1 << 20;
    const MemoryStats before = memory_stats(kGpu);
    {
      at::Tensor t = at::empty({mib / 4}, at::TensorOptions().device(kGpu).dtype(at::kFloat));
      const MemoryStats during = memory_stats(kGpu);
      EXPECT_EQ(during.current_bytes - before.current_bytes, mib);
      EXPECT_GE(during.peak_bytes, during.current_bytes);
      EXPECT_EQ(memory_stats(c10::Device(c10::kCUDA)).current_bytes, during.current_bytes);  // the current device
    }
    EXPECT_EQ(memory_stats(kGpu).current_bytes, before.current_bytes);
    EXPECT_GE(memory_stats(kGpu).peak_bytes, before.current_bytes + mib);
    EXPECT_GE(memory_stats(kGpu).cached_bytes, mib);  // the freed block stays reserved
    reset_peak_memory_stats(kGpu);
    EXPECT_EQ(memory_stats(kGpu).peak_bytes, memory_stats(kGpu).current_bytes);
  }, options);
}

FSDPP_INSTANTIATE_WORLD_SIZES(CudaCollectives);

}  // namespace
}  // namespace fsdpp
