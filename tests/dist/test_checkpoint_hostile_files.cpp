// Hand-made hostile checkpoints (issue 15): chunks that overlap and leave a hole, chunks outside
// the tensor, shapes whose size overflows, plain values out of range, a FIFO where a file should
// be, and links out of the checkpoint directory. Each is refused by verify (the API and
// fsdpp-ckpt) and by load, naming the tensor, key or file at fault, and never hangs: every test
// runs under the harness's deadline, so a FIFO that blocks fails it instead of stalling CI.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/types.h>

#include <filesystem>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

#include "checkpoint/checkpoint_test_util.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

namespace ckpt = checkpoint;
namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;
using testing::RankContext;

// One process, no process group, a short deadline (a blocking open fails the test).
testing::RunOptions alone() {
  testing::RunOptions o;
  o.init_process_group = false;
  o.deadline = std::chrono::seconds(60);
  return o;
}

// w [8, 4] saved as two row chunks, w@0,0 (rows 0-3) and w@4,0 (rows 4-7), plus "step".
const at::Tensor& saved_w() {
  static const at::Tensor w = at::arange(32, at::kFloat).reshape({8, 4});
  return w;
}
void save_two_chunks(const std::string& dir) {
  const at::Tensor& w = saved_w();
  ckpt::save({{"w", ckpt::Entry::sharded({8, 4}, {ckpt::LocalShard{w.slice(0, 0, 4).clone(), {0, 0}},
                                                  ckpt::LocalShard{w.slice(0, 4, 8).clone(), {4, 0}}})},
              {"step", int64_t{7}}},
             dir);
}

// The tensor's chunk named `name` in the metadata.
json& chunk_named(json& j, const std::string& name) {
  for (auto& c : j["entries"]["w"]["chunks"])
    if (c["name"] == name) return c;
  throw std::runtime_error("no chunk " + name);
}

// fsdpp-ckpt verify: its exit status and what it printed.
std::string tool_verify(const std::string& dir, int& status) {
  return testing::run_command("timeout 30 " + testing::ckpt_tool() + " verify " + dir + " 2>&1", status);
}

std::string all(const std::vector<std::string>& problems) {
  std::string s;
  for (const auto& p : problems) s += p + "\n";
  return s;
}

// Loads w whole into a tensor of -1s; returns the error (the tensor must be unchanged by it).
std::string load_w(const std::string& dir, bool verify, std::vector<int64_t> shape = {8, 4}) {
  at::Tensor w = at::full(shape, -1.0);
  const std::string e = error_of([&] {
    ckpt::State s{{"w", w}};
    ckpt::load(s, dir, ckpt::LoadOptions().verify(verify));
  });
  EXPECT_TRUE(at::equal(w, at::full(shape, -1.0))) << "a failed load changed the tensor";
  return e;
}

// The case of the issue: w@4,0 moved to rows 2-5 overlaps w@0,0, and rows 6-7 are in no chunk.
// The element count still adds up to 32, which is why counting passed it as "ok".
TEST(CheckpointHostileFiles, OverlappingChunksLeavingAHoleAreRefused) {
  testing::run_ranks(1, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    save_two_chunks(dir);
    testing::edit_metadata(dir, [](json& j) { chunk_named(j, "w@4,0")["offsets"] = {2, 0}; });
    const std::string want = "tensor 'w' is not tiled exactly by its chunks: chunk 'w@0,0' (offsets [0, 0] sizes [4, 4]) "
                             "and chunk 'w@4,0' (offsets [2, 0] sizes [4, 4]) overlap";
    const auto problems = ckpt::verify(dir);
    EXPECT_NE(all(problems).find(want), std::string::npos) << all(problems);
    int status = 0;
    const std::string out = tool_verify(dir, status);
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_EQ(out.find(": ok"), std::string::npos) << out;
    for (bool verify : {true, false}) {
      const std::string e = load_w(dir, verify);
      EXPECT_NE(e.find("checkpoint " + dir + ": " + want), std::string::npos) << e;
    }
    // A shard that reads only the untouched rows is refused too: the checkpoint is corrupt.
    at::Tensor top = at::full({2, 4}, -1.0);
    ckpt::State s{{"w", ckpt::Entry::sharded(top, {0, 0}, {8, 4})}};
    EXPECT_NE(error_of([&] { ckpt::load(s, dir); }).find(want), std::string::npos);
  }, alone());
}

// Chunks that do not overlap but leave rows of the tensor in no chunk: the error names the rows.
TEST(CheckpointHostileFiles, HoleIsRefusedNamingTheMissingRegion) {
  testing::run_ranks(1, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    save_two_chunks(dir);
    testing::edit_metadata(dir, [](json& j) { j["entries"]["w"]["shape"] = {10, 4}; });
    const std::string want = "tensor 'w' is not tiled exactly by its chunks: the chunks hold 32 of the 40 elements at "
                             "offsets [0, 0] sizes [10, 4]; no chunk holds offsets [8, 0] sizes [2, 4]";
    EXPECT_NE(all(ckpt::verify(dir)).find(want), std::string::npos) << all(ckpt::verify(dir));
    int status = 0;
    EXPECT_NE(tool_verify(dir, status).find(want), std::string::npos);
    EXPECT_EQ(status, 1);
    const std::string e = load_w(dir, false, {10, 4});
    EXPECT_NE(e.find(want), std::string::npos) << e;
  }, alone());
}

// A chunk past the tensor's end, including offsets whose sum with the size would wrap int64.
TEST(CheckpointHostileFiles, ChunkOutsideTheTensorIsRefused) {
  testing::run_ranks(1, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    save_two_chunks(dir);
    const std::string pristine = testing::read_metadata_text(dir);
    for (int64_t row : {int64_t{6}, INT64_MAX, INT64_MAX - 2}) {
      testing::write_metadata_text(dir, pristine);
      testing::edit_metadata(dir, [&](json& j) { chunk_named(j, "w@4,0")["offsets"] = {row, 0}; });
      const std::string want = "sizes [4, 4] lies outside the shape [8, 4]";
      const std::string e = load_w(dir, true);
      EXPECT_NE(e.find(dir + "/metadata.json is not valid checkpoint metadata (entry 'w')"), std::string::npos) << e;
      EXPECT_NE(e.find(want), std::string::npos) << row << ": " << e;
      EXPECT_NE(error_of([&] { ckpt::verify(dir); }).find(want), std::string::npos) << row;
    }
  }, alone());
}

// A [2^40, 2^40] shape: its element count wraps to 0 in int64 arithmetic ("13056 of 0 elements"
// before); now the metadata is refused, naming the shape.
TEST(CheckpointHostileFiles, HugeShapeIsRefusedWithoutOverflow) {
  testing::run_ranks(1, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    save_two_chunks(dir);
    const int64_t big = int64_t{1} << 40;
    testing::edit_metadata(dir, [&](json& j) { j["entries"]["w"]["shape"] = {big, big}; });
    const std::string want = "(entry 'w'): shape [1099511627776, 1099511627776] of F32 is not a tensor size";
    const std::string e = error_of([&] { ckpt::verify(dir); });
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_EQ(e.find("of 0 elements"), std::string::npos) << e;
    int status = 0;
    const std::string out = tool_verify(dir, status);
    EXPECT_EQ(status, 1);
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_NE(load_w(dir, true).find(want), std::string::npos);
    // Just past int64 in bytes though not in elements (2^62 F32 elements = 2^64 bytes).
    testing::edit_metadata(dir, [&](json& j) { j["entries"]["w"]["shape"] = {int64_t{1} << 62}; });
    EXPECT_NE(error_of([&] { ckpt::read_metadata(dir); }).find("more bytes than a 64-bit count holds"),
              std::string::npos);
  }, alone());
}

// "step": 1e40 used to load as INT64_MIN. Every integer of the metadata is checked the same way.
TEST(CheckpointHostileFiles, PlainValueOutOfRangeIsRefused) {
  testing::run_ranks(1, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    save_two_chunks(dir);
    const std::string pristine = testing::read_metadata_text(dir);
    const std::string step = "\"value\": 7";
    ASSERT_NE(pristine.find(step), std::string::npos) << pristine;
    auto with_step = [&](const std::string& value) {
      std::string text = pristine;
      text.replace(text.find(step), step.size(), "\"value\": " + value);
      testing::write_metadata_text(dir, text);
    };
    for (const std::string bad : {"1e40", "-1e40", "2.5", "9223372036854775808", "18446744073709551615"}) {
      with_step(bad);
      ckpt::State s{{"step", int64_t{3}}};
      const std::string e = error_of([&] { ckpt::load(s, dir); });
      EXPECT_NE(e.find(dir + "/metadata.json is not valid checkpoint metadata (entry 'step'): \"value\" is "),
                std::string::npos) << bad << ": " << e;
      EXPECT_NE(e.find("not a 64-bit integer"), std::string::npos) << bad << ": " << e;
      EXPECT_EQ(s["step"].to_int(), 3) << bad;
    }
    // The extremes that do fit load exactly.
    for (int64_t ok : {INT64_MAX, INT64_MIN}) {
      with_step(std::to_string(ok));
      ckpt::State s{{"step", int64_t{3}}};
      ckpt::load(s, dir);
      EXPECT_EQ(s["step"].to_int(), ok);
    }
    // Integers outside the entries too: world_size, a file size, a chunk's byte range.
    testing::write_metadata_text(dir, pristine);
    testing::edit_metadata(dir, [](json& j) { j["world_size"] = 1e40; });
    EXPECT_NE(error_of([&] { ckpt::read_metadata(dir); }).find("\"world_size\" is 1e+40, not a 64-bit integer"),
              std::string::npos);
    testing::write_metadata_text(dir, pristine);
    testing::edit_metadata(dir, [](json& j) { chunk_named(j, "w@0,0")["byte_range"][1] = 1e40; });
    EXPECT_NE(error_of([&] { ckpt::read_metadata(dir); }).find("(entry 'w'): \"byte_range\" is 1e+40"),
              std::string::npos);
  }, alone());
}

// A FIFO where the data file should be: opening it for reading would block until a writer
// comes, i.e. forever. It is refused at once by verify, the tool and load.
TEST(CheckpointHostileFiles, FifoInPlaceOfADataFileIsRefused) {
  testing::run_ranks(1, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    save_two_chunks(dir);
    const std::string data = dir + "/rank-00000.safetensors";
    fs::remove(data);
    ASSERT_EQ(::mkfifo(data.c_str(), 0644), 0);
    const std::string want = data + " is a FIFO, not a regular file; refusing to read it";
    EXPECT_NE(all(ckpt::verify(dir)).find(want), std::string::npos) << all(ckpt::verify(dir));
    int status = 0;
    const std::string out = tool_verify(dir, status);
    EXPECT_EQ(status, 1) << out;  // 124 would be timeout(1): the tool blocked
    EXPECT_NE(out.find(want), std::string::npos) << out;
    for (bool verify : {true, false}) EXPECT_NE(load_w(dir, verify).find(want), std::string::npos);
    // metadata.json as a FIFO, and a directory in a data file's place.
    save_two_chunks(ctx.temp_dir + "/ckpt2");
    fs::remove(ctx.temp_dir + "/ckpt2/metadata.json");
    ASSERT_EQ(::mkfifo((ctx.temp_dir + "/ckpt2/metadata.json").c_str(), 0644), 0);
    EXPECT_NE(load_w(ctx.temp_dir + "/ckpt2", true).find("/ckpt2/metadata.json is a FIFO, not a regular file"),
              std::string::npos);
    fs::remove(data);
    fs::create_directory(data);
    EXPECT_NE(load_w(dir, false).find(data + " is a directory, not a regular file"), std::string::npos);
  }, alone());
}

// Links out of the checkpoint directory are refused, even to an intact copy of the file; links
// that stay inside it (and a checkpoint directory reached through a link) are fine.
TEST(CheckpointHostileFiles, SymlinksOutOfTheCheckpointAreRefused) {
  testing::run_ranks(1, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt", outside = ctx.temp_dir + "/outside";
    save_two_chunks(dir);
    fs::create_directory(outside);
    const std::string data = dir + "/rank-00000.safetensors", meta = dir + "/metadata.json";
    // A data file linked to a good copy outside.
    fs::copy_file(data, outside + "/rank-00000.safetensors");
    fs::remove(data);
    fs::create_symlink(outside + "/rank-00000.safetensors", data);
    const std::string want = data + " leads outside the checkpoint directory " + dir;
    EXPECT_NE(all(ckpt::verify(dir)).find(want), std::string::npos) << all(ckpt::verify(dir));
    int status = 0;
    const std::string out = tool_verify(dir, status);
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
    for (bool verify : {true, false}) EXPECT_NE(load_w(dir, verify).find(want), std::string::npos);
    // A relative link climbing out with "..".
    fs::remove(data);
    fs::create_symlink("../outside/rank-00000.safetensors", data);
    EXPECT_NE(load_w(dir, true).find(want), std::string::npos);
    // A link to /dev/zero (zeros with verify(false) before): outside, and not a regular file.
    fs::remove(data);
    fs::create_symlink("/dev/zero", data);
    EXPECT_NE(load_w(dir, false).find(data + " is a character device, not a regular file"), std::string::npos);
    EXPECT_FALSE(ckpt::verify(dir).empty());
    // metadata.json linked outside.
    fs::remove(data);
    fs::copy_file(outside + "/rank-00000.safetensors", data);
    ASSERT_TRUE(ckpt::verify(dir).empty());
    fs::copy_file(meta, outside + "/metadata.json");
    fs::remove(meta);
    fs::create_symlink(outside + "/metadata.json", meta);
    EXPECT_NE(load_w(dir, true).find(meta + " leads outside the checkpoint directory"), std::string::npos);
    EXPECT_NE(error_of([&] { ckpt::verify(dir); }).find(meta + " leads outside"), std::string::npos);
  }, alone());
}

TEST(CheckpointHostileFiles, SymlinksInsideTheCheckpointAreAllowed) {
  testing::run_ranks(1, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    save_two_chunks(dir);
    // The data file moved into a subdirectory of the checkpoint and linked from its place.
    fs::create_directory(dir + "/blobs");
    fs::rename(dir + "/rank-00000.safetensors", dir + "/blobs/data");
    fs::create_symlink("blobs/data", dir + "/rank-00000.safetensors");
    // The checkpoint reached through a link ("latest" -> a step directory).
    fs::create_directory_symlink(dir, ctx.temp_dir + "/latest");
    for (const std::string& d : {dir, ctx.temp_dir + "/latest"}) {
      EXPECT_TRUE(ckpt::verify(d).empty()) << all(ckpt::verify(d));
      at::Tensor w = at::zeros({8, 4});
      ckpt::State s{{"w", w}};
      ckpt::load(s, d, ckpt::LoadOptions().verify(false));
      EXPECT_TRUE(at::equal(w, saved_w())) << d;
    }
  }, alone());
}

}  // namespace
}  // namespace fsdpp
