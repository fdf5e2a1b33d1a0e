// The tiling proof behind save's plan check, load and verify (src/checkpoint/tiling.h), and the
// chunk reader's refusal of a region its chunks do not cover exactly; and the save plan's use of
// it where ranks hold only empty shards.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>

#include "checkpoint/chunk_reader.h"
#include "checkpoint/tiling.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

using checkpoint::detail::Box;
using checkpoint::detail::check_tiling;
using Kind = checkpoint::detail::TilingProblem::Kind;

Box whole(std::vector<int64_t> shape) { return Box{std::vector<int64_t>(shape.size(), 0), shape}; }

TEST(CheckpointTiling, ExactTilingsPass) {
  EXPECT_EQ(check_tiling(whole({8, 4}), {Box{{0, 0}, {4, 4}}, Box{{4, 0}, {4, 4}}}).kind, Kind::kNone);
  EXPECT_EQ(check_tiling(whole({8, 4}), {Box{{0, 2}, {8, 2}}, Box{{0, 0}, {8, 2}}}).kind, Kind::kNone);  // columns
  EXPECT_EQ(check_tiling(whole({4, 4}), {Box{{0, 0}, {2, 2}}, Box{{0, 2}, {2, 2}}, Box{{2, 0}, {2, 2}},
                                         Box{{2, 2}, {2, 2}}}).kind,
            Kind::kNone);
  EXPECT_EQ(check_tiling(whole({}), {Box{{}, {}}}).kind, Kind::kNone);                        // a 0-d tensor
  EXPECT_EQ(check_tiling(whole({0, 4}), {}).kind, Kind::kNone);                               // empty tensor
  EXPECT_EQ(check_tiling(whole({3}), {Box{{0}, {3}}, Box{{3}, {0}}, Box{{1}, {0}}}).kind, Kind::kNone);  // empty chunks
  // A region that does not start at 0 (a rank's shard), tiled by what overlaps it.
  EXPECT_EQ(check_tiling(Box{{2, 0}, {4, 4}}, {Box{{2, 0}, {2, 4}}, Box{{4, 0}, {2, 4}}}).kind, Kind::kNone);
}

TEST(CheckpointTiling, OverlapHoleOutsideAndOverflowAreFound) {
  // The issue's case: counts add up (16 + 16 = 32) but rows 6-7 are missing.
  auto p = check_tiling(whole({8, 4}), {Box{{0, 0}, {4, 4}}, Box{{2, 0}, {4, 4}}});
  EXPECT_EQ(p.kind, Kind::kOverlap);
  EXPECT_EQ(p.a, 0u);
  EXPECT_EQ(p.b, 1u);
  // Overlap found whatever the order and however far apart in the list.
  p = check_tiling(whole({8}), {Box{{5}, {3}}, Box{{0}, {2}}, Box{{2}, {2}}, Box{{3}, {1}}});
  EXPECT_EQ(p.kind, Kind::kOverlap);
  EXPECT_EQ(p.a, 2u);
  EXPECT_EQ(p.b, 3u);
  // Two 0-d chunks of one scalar.
  EXPECT_EQ(check_tiling(whole({}), {Box{{}, {}}, Box{{}, {}}}).kind, Kind::kOverlap);
  // A hole, and where it is.
  p = check_tiling(whole({10, 4}), {Box{{0, 0}, {4, 4}}, Box{{4, 0}, {4, 4}}});
  EXPECT_EQ(p.kind, Kind::kHole);
  EXPECT_EQ(p.covered, 32);
  EXPECT_EQ(p.total, 40);
  ASSERT_TRUE(p.hole_found);
  EXPECT_EQ(p.hole.offsets, (std::vector<int64_t>{8, 0}));
  EXPECT_EQ(p.hole.sizes, (std::vector<int64_t>{2, 4}));
  p = check_tiling(whole({4, 4}), {Box{{0, 0}, {4, 2}}, Box{{0, 2}, {3, 2}}});
  ASSERT_EQ(p.kind, Kind::kHole);
  EXPECT_EQ(p.hole.offsets, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(p.hole.sizes, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(check_tiling(whole({}), {}).kind, Kind::kHole);
  // Outside, including sums that would wrap int64 and a wrong number of dimensions.
  for (const Box& b : {Box{{6}, {4}}, Box{{-1}, {2}}, Box{{INT64_MAX}, {4}}, Box{{2}, {INT64_MAX}}, Box{{0, 0}, {1, 1}}}) {
    p = check_tiling(whole({8}), {Box{{0}, {2}}, b});
    EXPECT_EQ(p.kind, Kind::kOutside);
    EXPECT_EQ(p.a, 1u);
  }
  // 2^40 x 2^40 elements do not fit a 64-bit count (they wrapped to 0 before).
  EXPECT_EQ(check_tiling(whole({int64_t{1} << 40, int64_t{1} << 40}), {}).kind, Kind::kTooLarge);
}

TEST(CheckpointTiling, DescriptionsNameChunksAndRegions) {
  auto label = [](size_t i) { return "chunk #" + std::to_string(i); };
  const Box w = whole({8, 4});
  EXPECT_EQ(describe(check_tiling(w, {Box{{0, 0}, {4, 4}}, Box{{2, 0}, {4, 4}}}), w, label),
            "chunk #0 and chunk #1 overlap");
  EXPECT_EQ(describe(check_tiling(w, {Box{{0, 0}, {4, 4}}}), w, label),
            "the chunks hold 16 of the 32 elements at offsets [0, 0] sizes [8, 4]; no chunk holds offsets [4, 0] "
            "sizes [4, 4]");
  EXPECT_EQ(describe(check_tiling(w, {Box{{6, 0}, {4, 4}}}), w, label),
            "chunk #0 lies outside offsets [0, 0] sizes [8, 4]");
}

// A destination region the chunks do not cover exactly is refused before any byte is read (no
// data file exists here: reaching a read would fail differently), naming tensor and region.
TEST(CheckpointTiling, ChunkReaderRefusesARegionNotCoveredExactly) {
  checkpoint::EntryInfo e;
  e.dtype = "F32";
  e.shape = {8};
  for (int64_t at : {0, 2}) {
    checkpoint::ChunkInfo c;
    c.offsets = {at};
    c.sizes = {4};
    c.file = "absent.safetensors";
    c.name = "w@" + std::to_string(at);
    c.begin = 8 + at * 4;
    c.end = c.begin + 16;
    e.chunks.push_back(c);
  }
  checkpoint::detail::ChunkReader reader("/nonexistent-fsdpp-dir", /*verify=*/false, /*confine=*/true);
  std::string err = testing::error_of([&] { reader.read("w", e, Box{{0}, {8}}); });
  EXPECT_NE(err.find("tensor 'w': the checkpoint's chunks do not cover the region offsets [0] sizes [8] exactly: "
                     "chunk 'w@0' (offsets [0] sizes [4]) and chunk 'w@2' (offsets [2] sizes [4]) overlap"),
            std::string::npos)
      << err;
  err = testing::error_of([&] { reader.read("w", e, Box{{5}, {3}}); });
  EXPECT_NE(err.find("tensor 'w': the checkpoint's chunks do not cover the region offsets [5] sizes [3] exactly: "
                     "the chunks hold 1 of the 3 elements at offsets [5] sizes [3]; no chunk holds offsets [6] sizes [2]"),
            std::string::npos)
      << err;
  // A region the chunks do cover gets as far as opening the file.
  err = testing::error_of([&] { reader.read("w", e, Box{{0}, {1}}); });
  EXPECT_NE(err.find("cannot open /nonexistent-fsdpp-dir/absent.safetensors"), std::string::npos) << err;
}

// Every rank's shard of w is empty: the plan knows the tensor and refuses its hole (it used to
// drop the key silently). An empty tensor is saved with no chunks and loads back.
TEST(CheckpointTiling, SavePlanSeesTensorsWhoseShardsAreAllEmpty) {
  testing::run_ranks(2, [](testing::RankContext& ctx) {
    namespace ckpt = checkpoint;
    const std::string dir = ctx.temp_dir + "/ckpt";
    ckpt::State hole{{"w", ckpt::Entry::sharded(at::zeros({0, 2}), {5, 0}, {5, 2})}};
    const std::string e = testing::error_of([&] { ckpt::save(hole, dir); });
    EXPECT_NE(e.find("the ranks' shards of tensor 'w' cover 0 of the 10 elements of its global shape [5, 2]; no rank "
                     "holds offsets [0, 0] sizes [5, 2]"),
              std::string::npos)
        << e;
    // Global shapes past 64-bit counts are refused before anything is written.
    const int64_t big = int64_t{1} << 40;
    ckpt::State huge{{"h", ckpt::Entry::sharded(at::ones({1, 1}), {ctx.rank, 0}, {big, big})}};
    EXPECT_NE(testing::error_of([&] { ckpt::save(huge, dir); }).find("has more elements than a 64-bit count holds"),
              std::string::npos);
    ckpt::State wide{{"h", ckpt::Entry::sharded(at::ones({1}), {ctx.rank}, {int64_t{1} << 62})}};
    EXPECT_NE(testing::error_of([&] { ckpt::save(wide, dir); }).find("has more bytes than a 64-bit count holds"),
              std::string::npos);
    EXPECT_FALSE(std::filesystem::exists(dir));
    ckpt::State empty{{"e", at::zeros({0, 4})},
                      {"w", ckpt::Entry::sharded(at::full({ctx.rank == 0 ? 5 : 0, 2}, 1.0), {ctx.rank * 5, 0}, {5, 2})}};
    ckpt::save(empty, dir);
    const auto m = ckpt::read_metadata(dir);
    ASSERT_EQ(m.entries.count("e"), 1u);
    EXPECT_TRUE(m.entries.at("e").chunks.empty());
    EXPECT_EQ(m.entries.at("w").chunks.size(), 1u) << "an empty shard is not a chunk";
    at::Tensor back = at::full({0, 4}, 1.0), w = at::zeros({5, 2});
    ckpt::State s{{"e", back}, {"w", w}};
    ckpt::load(s, dir);
    EXPECT_TRUE(at::equal(w, at::ones({5, 2})));
  });
}

}  // namespace
}  // namespace fsdpp
