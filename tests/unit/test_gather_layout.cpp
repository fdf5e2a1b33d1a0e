// Where an all-gather into a layout puts each rank's elements (FSDP's unsharded parameter-major
// layout), however the input arrives in pieces.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "comm/gather_layout.h"

namespace fsdpp::detail {
namespace {

// Three parameters with padded chunks of 3, 0 and 2 elements: a rank's block is 5 elements.
GatherLayout three_params(int64_t blocks_per_member) {
  GatherLayout layout;
  layout.block_numel = 5;
  layout.blocks_per_member = blocks_per_member;
  layout.ranks = 4;
  layout.pieces = {{0, 3, 0}, {3, 0, 3 * layout.ranks}, {3, 2, 3 * layout.ranks}};
  return layout;
}

// Rank r's block holds 100 r + (parameter i's element j of the chunk) = 100 r + 10 i + j.
std::vector<int32_t> block_of(int64_t rank) {
  return {int32_t(100 * rank), int32_t(100 * rank + 1), int32_t(100 * rank + 2), int32_t(100 * rank + 20),
          int32_t(100 * rank + 21)};
}

// Parameter-major: parameter 0's chunks of ranks 0..3, then parameter 2's.
std::vector<int32_t> unsharded_of_four_ranks() {
  std::vector<int32_t> out;
  for (int i : {0, 2})
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < (i == 0 ? 3 : 2); ++j) out.push_back(100 * r + 10 * i + j);
  return out;
}

TEST(GatherLayout, PlacesEachRanksChunksWithTheParameter) {
  const GatherLayout layout = three_params(1);
  std::vector<int32_t> out(20, -1);
  for (int r = 0; r < 4; ++r) {
    const std::vector<int32_t> block = block_of(r);
    layout.place(out.data(), r, 0, 5, block.data(), sizeof(int32_t));
  }
  EXPECT_EQ(out, unsharded_of_four_ranks());
}

TEST(GatherLayout, PiecesOfAnyLengthLandTheSame) {
  // The shared-memory transport hands over a member's input in rounds of its own length.
  for (int64_t piece = 1; piece <= 10; ++piece) {
    const GatherLayout layout = three_params(2);  // members 0 and 1, two ranks' blocks each
    std::vector<int32_t> out(20, -1);
    for (int member = 0; member < 2; ++member) {
      std::vector<int32_t> input = block_of(2 * member);
      const std::vector<int32_t> second = block_of(2 * member + 1);
      input.insert(input.end(), second.begin(), second.end());
      for (int64_t first = 0; first < 10; first += piece)
        layout.place(out.data(), member, first, std::min<int64_t>(piece, 10 - first), input.data() + first,
                     sizeof(int32_t));
    }
    EXPECT_EQ(out, unsharded_of_four_ranks()) << "pieces of " << piece;
  }
}

TEST(GatherLayout, PlacesARankMajorGather) {
  for (int64_t per_member : {1, 2, 4}) {
    std::vector<int32_t> gathered;
    for (int r = 0; r < 4; ++r) {
      const std::vector<int32_t> block = block_of(r);
      gathered.insert(gathered.end(), block.begin(), block.end());
    }
    std::vector<int32_t> out(20, -1);
    three_params(per_member).place_rank_major(out.data(), gathered.data(), sizeof(int32_t));
    EXPECT_EQ(out, unsharded_of_four_ranks()) << per_member << " ranks' blocks per member";
  }
}

}  // namespace
}  // namespace fsdpp::detail
