// The backend strings of init_process_group and what each puts behind CUDA tensors, on machines
// without a GPU (tests/gpu/ runs the CUDA tensors themselves where there is one). What these
// cannot show: that a CUDA tensor's collective takes the device path and its streams.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <fsdpp/collectives.h>
#include <fsdpp/memory.h>
#include <fsdpp/process_group.h>

#include "compat/cuda_runtime.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

using testing::error_of;
using testing::RankContext;

// PyTorch's forms: each registers Gloo for CPU tensors and Gloo or NCCL for CUDA tensors, and
// CPU tensors reduce over Gloo under every one that does not need a GPU.
TEST(DeviceBackends, EachBackendStringRegistersItsBackends) {
  for (const char* backend : {"gloo", "cpu:gloo,cuda:gloo", "cuda:gloo,cpu:gloo"}) {
    testing::RunOptions options;
    options.backend = backend;
    testing::run_ranks(2, [backend](RankContext& ctx) {
      auto group = ctx.world.backend();
      EXPECT_EQ(group->getBackend(c10::DeviceType::CPU)->getBackendName(), "gloo") << backend;
      EXPECT_EQ(group->getBackend(c10::DeviceType::CUDA)->getBackendName(), "gloo") << backend;
      at::Tensor t = at::full({3}, ctx.rank + 1.0);
      all_reduce(t, ReduceOp::SUM, ctx.world);
      EXPECT_TRUE(at::equal(t, at::full({3}, 3.0))) << backend;
    }, options);
  }
}

TEST(DeviceBackends, NcclWithoutADeviceSaysSo) {
  testing::RunOptions options;
  options.init_process_group = false;
  testing::run_ranks(1, [](RankContext& ctx) {
    if (compat::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present (tests/gpu/ covers NCCL)";
    const std::string expected = compat::built_with_cuda() ? "backend 'nccl' needs a CUDA device and this process sees none"
                                                           : "backend 'nccl' needs CUDA, and this libfsdpp was built";
    for (const char* backend : {"nccl", "cpu:gloo,cuda:nccl"}) {
      const std::string m = error_of([&] {
        init_process_group(
            InitProcessGroupOptions().backend(backend).init_method("file://" + ctx.store_path).rank(0).world_size(1));
      });
      EXPECT_NE(m.find(expected), std::string::npos) << backend << ": " << m;
    }
    const std::string m = error_of([] { memory_stats(c10::Device("cuda:0")); });
    EXPECT_NE(m.find(compat::built_with_cuda() ? "memory_stats() of cuda:0: this process sees 0 CUDA device(s)"
                                               : "memory_stats() of a CUDA device needs CUDA"),
              std::string::npos)
        << m;
  }, options);
}

// memory_stats(cpu) is memory_stats(), and a device that is neither is named.
TEST(DeviceBackends, MemoryStatsOfTheCpuDevice) {
  at::Tensor t = at::empty({1 << 18}, at::kFloat);
  const MemoryStats cpu = memory_stats(), device = memory_stats(c10::Device(c10::kCPU));
  EXPECT_EQ(cpu.current_bytes, device.current_bytes);
  EXPECT_EQ(cpu.peak_bytes, device.peak_bytes);
  const std::string m = error_of([] { memory_stats(c10::Device("meta")); });
  EXPECT_NE(m.find("memory_stats: device meta is neither the CPU nor a CUDA device"), std::string::npos) << m;
}

}  // namespace
}  // namespace fsdpp
