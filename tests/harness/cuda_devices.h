#pragma once
// Whether the ranks a test forks can use a CUDA device. The test process itself must not touch
// CUDA (a process that has cannot fork ranks that use it), so a child is asked once.
#include <gtest/gtest.h>

namespace fsdpp::testing {

int cuda_devices_seen_by_ranks();

}  // namespace fsdpp::testing

// The GPU tests' skip on machines without one (CI's: every CUDA path compiles there, none runs).
#define FSDPP_SKIP_WITHOUT_CUDA()                                   \
  if (::fsdpp::testing::cuda_devices_seen_by_ranks() == 0) GTEST_SKIP() << "needs a CUDA device"
