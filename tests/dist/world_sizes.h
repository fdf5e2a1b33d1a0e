#pragma once
// World sizes every multi-process test runs at: 3 catches padding bugs.
#include <gtest/gtest.h>

#include <string>

namespace fsdpp::testing {

class WorldSizeTest : public ::testing::TestWithParam<int> {};

inline std::string world_size_name(const ::testing::TestParamInfo<int>& info) {
  return "WorldSize" + std::to_string(info.param);
}

}  // namespace fsdpp::testing

#define FSDPP_INSTANTIATE_WORLD_SIZES(suite) \
  INSTANTIATE_TEST_SUITE_P(, suite, ::testing::Values(1, 2, 3, 4), ::fsdpp::testing::world_size_name)
