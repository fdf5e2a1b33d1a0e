// A save that runs out of space for real (issue 15): a 1 MiB tmpfs, a previous checkpoint on it,
// then a save whose rank 1 writes 2 MiB. Every rank throws naming rank 1 and its file, the
// staging directory is gone (and its space with it), the previous checkpoint still loads and
// verifies, and async_save reports the same from wait(). Needs root to mount; skips otherwise
// (CI runs as root, so it runs there).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <ATen/ATen.h>

#include <fsdpp/checkpoint.h>
#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "checkpoint/small_file_system.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

namespace ckpt = checkpoint;
namespace fs = std::filesystem;
using testing::error_of;
using testing::RankContext;

constexpr int64_t kFileSystemBytes = 1 << 20;

// The checkpoint already at the path: w [8, 4], rows 0-3 all 1 (rank 0), rows 4-7 all 2 (rank 1).
ckpt::State previous(int rank, double scale = 1) {
  return {{"w", ckpt::Entry::sharded(at::full({4, 4}, (rank + 1) * scale), {4 * rank, 0}, {8, 4})}};
}
at::Tensor previous_w(double scale = 1) { return at::cat({at::full({4, 4}, scale), at::full({4, 4}, 2 * scale)}); }

// Twice the file system: rank 1 alone holds (and so writes) the 2 MiB "big".
ckpt::State too_big(int rank) {
  ckpt::State s{{"w", ckpt::Entry::sharded(at::full({4, 4}, 9.0), {4 * rank, 0}, {8, 4})}};
  if (rank == 1) s["big"] = at::ones({512, 1024});
  return s;
}

void expect_disk_full_error(const std::string& e, const std::string& dir) {
  EXPECT_NE(e.find("checkpoint::save to " + dir + " failed (the previous checkpoint there, if any, is untouched)"),
            std::string::npos) << e;
  // Mid-file: the header and w went in, the space ran out inside "big".
  EXPECT_NE(e.find("rank 1: writing tensor 'big' to " + dir + ".tmp-"), std::string::npos) << e;
  EXPECT_NE(e.find("/rank-00001.safetensors failed: No space left on device"), std::string::npos) << e;
}

// After every rank has thrown: no staging left (nor its space), the previous checkpoint intact,
// and the file system usable again.
void expect_recovered(const RankContext& ctx, const std::string& root, const std::string& dir) {
  barrier(ctx.world);
  if (ctx.rank == 0) {
    for (const auto& d : fs::directory_iterator(root))
      EXPECT_EQ(d.path().filename().string(), "ckpt") << "left behind: " << d.path();
    EXPECT_GT(testing::free_bytes(root), testing::total_bytes(root) - (64 << 10))
        << "the failed save's space was not given back";
    EXPECT_TRUE(ckpt::verify(dir).empty());
  }
  at::Tensor w = at::zeros({8, 4});
  ckpt::State back{{"w", w}};
  ckpt::load(back, dir);
  EXPECT_TRUE(at::equal(w, previous_w())) << "rank " << ctx.rank << ": the previous checkpoint changed";
  barrier(ctx.world);
  ckpt::save(previous(ctx.rank, 3), dir);
  ckpt::load(back, dir);
  EXPECT_TRUE(at::equal(w, previous_w(3)));
}

TEST(CheckpointDiskFull, SaveRunsOutOfSpaceMidFile) {
  if (!testing::on_small_file_system()) {
    const std::string why = testing::rerun_on_small_file_system(kFileSystemBytes);
    if (!why.empty()) GTEST_SKIP() << why;
    return;
  }
  testing::run_ranks(2, [](RankContext& ctx) {
    const std::string root = testing::small_file_system_root(), dir = root + "/ckpt";
    ckpt::save(previous(ctx.rank), dir);
    const std::string e = error_of([&] { ckpt::save(too_big(ctx.rank), dir); });
    expect_disk_full_error(e, dir);
    expect_recovered(ctx, root, dir);
  });
}

TEST(CheckpointDiskFull, AsyncSaveReportsItFromWait) {
  if (!testing::on_small_file_system()) {
    const std::string why = testing::rerun_on_small_file_system(kFileSystemBytes);
    if (!why.empty()) GTEST_SKIP() << why;
    return;
  }
  testing::run_ranks(2, [](RankContext& ctx) {
    const std::string root = testing::small_file_system_root(), dir = root + "/ckpt";
    ckpt::save(previous(ctx.rank), dir);
    ckpt::SaveHandle handle = ckpt::async_save(too_big(ctx.rank), dir);
    const std::string e = error_of([&] { handle.wait(); });
    EXPECT_TRUE(handle.done());
    expect_disk_full_error(e, dir);
    expect_recovered(ctx, root, dir);
  });
}

}  // namespace
}  // namespace fsdpp
