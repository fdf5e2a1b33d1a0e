#pragma once
// What the GPU tests share: the device (every rank of a test shares GPU 0) and
// make_multi_group's model built on it.
#include <torch/torch.h>

#include "dist/fsdp_test_util.h"
#include "harness/cuda_devices.h"

namespace fsdpp::testing {

inline const at::Device kGpu(at::kCUDA, 0);

// make_multi_group's wrapped model (its modules made in its order: the same initial values) with
// its parameters moved to the GPU before wrapping: a unit shards the device its parameters are on.
inline FSDPSequential multi_group_on_the_gpu(const FullyShardOptions& options) {
  torch::manual_seed(42);
  Linear l1(7, 15), l2(15, 15), l3(15, 3);
  for (Linear* l : {&l1, &l2, &l3}) (*l)->to(kGpu);
  return FSDPSequential(Sequential(FSDPLinear(l1, options), ReLU(), FSDPLinear(l2, options), ReLU(), l3), options);
}

}  // namespace fsdpp::testing
