#pragma once
// What the GPU tests share: the device (every rank of a test shares GPU 0), make_multi_group's
// model built on it, and how a GPU test is registered.
#include <chrono>
#include <utility>

#include <torch/torch.h>

#include "comm/device_handoff.h"
#include "dist/fsdp_test_util.h"
#include "harness/cuda_devices.h"

namespace fsdpp::testing {

inline const at::Device kGpu(at::kCUDA, 0);

// `body(RankContext&)` with every collective ending a millisecond of GPU time after it could
// (a sleep kernel queued on its stream first): a consumer that does not wait for it, or a buffer
// reused before it is done, then reads stale data even with the tests' microsecond-sized compute.
template <typename Body>
auto with_delayed_collectives(Body body) {
  return [body](RankContext& ctx) {
    detail::set_device_collective_delay(std::chrono::milliseconds(1));
    body(ctx);
  };
}

// `body(RankContext&)` on one rank over NCCL (which refuses two ranks on one GPU).
template <typename Body>
void run_on_nccl_alone(Body&& body) {
  RunOptions options;
  options.backend = "nccl";
  run_ranks(1, with_delayed_collectives(std::forward<Body>(body)), options);
}

}  // namespace fsdpp::testing

// A test of `suite` (a WorldSizeTest, instantiated with FSDPP_INSTANTIATE_WORLD_SIZES) that
// runs `body(RankContext&)` on 1-4 ranks sharing the GPU over Gloo, its collectives delayed;
// skipped without a GPU.
#define FSDPP_GPU_TEST_P(suite, name, body)                                                      \
  TEST_P(suite, name) {                                                                          \
    FSDPP_SKIP_WITHOUT_CUDA();                                                                   \
    ::fsdpp::testing::run_ranks(GetParam(), ::fsdpp::testing::with_delayed_collectives(body)); \
  }
// The same on one rank over NCCL.
#define FSDPP_GPU_NCCL_TEST(suite, name, body) \
  TEST(suite, name) {                          \
    FSDPP_SKIP_WITHOUT_CUDA();                 \
    ::fsdpp::testing::run_on_nccl_alone(body); \
  }

namespace fsdpp::testing {

// make_multi_group's wrapped model (its modules made in its order: the same initial values) with
// its parameters moved to the GPU before wrapping: a unit shards the device its parameters are on.
inline FSDPSequential multi_group_on_the_gpu(const FullyShardOptions& options) {
  torch::manual_seed(42);
  Linear l1(7, 15), l2(15, 15), l3(15, 3);
  for (Linear* l : {&l1, &l2, &l3}) (*l)->to(kGpu);
  return FSDPSequential(Sequential(FSDPLinear(l1, options), ReLU(), FSDPLinear(l2, options), ReLU(), l3), options);
}

}  // namespace fsdpp::testing
