#pragma once
// What the GPU tests share: the device (every rank of a test shares GPU 0), make_multi_group's
// model built on it, and how a GPU test is registered.
#include <utility>

#include <torch/torch.h>

#include "dist/fsdp_test_util.h"
#include "harness/cuda_devices.h"

namespace fsdpp::testing {

inline const at::Device kGpu(at::kCUDA, 0);

// `body(RankContext&)` on one rank over NCCL (which refuses two ranks on one GPU).
template <typename Body>
void run_on_nccl_alone(Body&& body) {
  RunOptions options;
  options.backend = "nccl";
  run_ranks(1, std::forward<Body>(body), options);
}

}  // namespace fsdpp::testing

// A test of `suite` (a WorldSizeTest, instantiated with FSDPP_INSTANTIATE_WORLD_SIZES) that
// runs `body(RankContext&)` on 1-4 ranks sharing the GPU over Gloo; skipped without a GPU.
#define FSDPP_GPU_TEST_P(suite, name, body) \
  TEST_P(suite, name) {                     \
    FSDPP_SKIP_WITHOUT_CUDA();              \
    ::fsdpp::testing::run_ranks(GetParam(), body); \
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
