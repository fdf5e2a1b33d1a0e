#pragma once
// The ZeroRedundancyOptimizer test suite's fixture, shared by test_zero_redundancy_optimizer.cpp
// (which instantiates it at world sizes 1-4) and test_ddp_zero_overlap.cpp: one fixture type,
// so both files' tests are ZeroRedundancyOptimizer.<Test>/WorldSize<N>.
#include "dist/world_sizes.h"

namespace zero_test {

// The suite is named after the system (ZeroRedundancyOptimizer.StateDict/WorldSize2, ...).
class ZeroRedundancyOptimizer : public fsdpp::testing::WorldSizeTest {};

}  // namespace zero_test
