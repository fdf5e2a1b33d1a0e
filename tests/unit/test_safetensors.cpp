// Plain safetensors files: fsdpp's writer read by a stdlib-only Python reader, a file written the
// way Python's safetensors writes it loaded whole and into row shards, and bad files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

#include "checkpoint/checkpoint_test_util.h"
#include "harness/error_of.h"

namespace fsdpp {
namespace {

namespace ckpt = checkpoint;
namespace fs = std::filesystem;
using testing::error_of;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fsdpp-safetensors-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

std::map<std::string, at::Tensor> sample_tensors() {
  at::manual_seed(3);
  return {{"w", at::randn({5, 3})},
          {"b", at::randn({7}, at::kDouble)},
          {"steps", at::arange(6, at::kLong).reshape({2, 3})},
          {"h", at::randn({4}).to(at::kHalf)},
          {"bf", at::randn({3, 2}).to(at::kBFloat16)},
          {"mask", at::rand({5}) > 0.5},
          {"scalar", at::scalar_tensor(2.5)},
          {"empty", at::empty({0, 4})}};
}

TEST_F(Safetensors, RoundTripEveryDtype) {
  const auto tensors = sample_tensors();
  const std::string file = dir_ + "/m.safetensors";
  ckpt::save_safetensors(tensors, file, {{"format", "pt"}});
  const auto back = ckpt::load_safetensors(file);
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_EQ(back.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.at(name).sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::equal(back.at(name), t)) << name;
  }
  // The data starts 8-byte aligned, as the reference writer pads it.
  std::ifstream in(file, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
}

TEST_F(Safetensors, FileReadByStdlibPythonGivesTheSameBytes) {
  const auto tensors = sample_tensors();
  const std::string file = dir_ + "/m.safetensors";
  ckpt::save_safetensors(tensors, file);
  int status = 0;
  const std::string out = testing::run_command(testing::python() + " " + testing::python_tool() + " read " + file, status);
  ASSERT_EQ(status, 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    EXPECT_EQ(j.at(name).at("hex").get<std::string>(), testing::hex_of(t)) << name;
    EXPECT_EQ(j.at(name).at("shape").get<std::vector<int64_t>>(), t.sizes().vec()) << name;
  }
  EXPECT_EQ(j.at("bf").at("dtype"), "BF16");
  EXPECT_EQ(j.at("mask").at("dtype"), "BOOL");
}

// What safetensors_tool.py writes (see cmd_write).
std::map<std::string, at::Tensor> python_written() {
  std::map<std::string, at::Tensor> m;
  m["a.weight"] = at::arange(24, at::kFloat).mul(0.5).reshape({6, 4});
  m["b.bias"] = at::arange(5, at::kDouble).neg();
  m["c.index"] = at::arange(6, at::kLong).mul(1000).reshape({3, 2});
  m["d.half"] = at::arange(6, at::kFloat).add(0.25).to(at::kHalf).reshape({2, 3});
  m["e.bf16"] = at::arange(4, at::kFloat).mul(2).to(at::kBFloat16);
  m["f.mask"] = at::tensor({1, 0, 0, 1}, at::kByte).to(at::kBool);
  return m;
}

TEST_F(Safetensors, PythonWrittenFileLoadsWhole) {
  const std::string file = dir_ + "/hf.safetensors";
  int status = 0;
  testing::run_command(testing::python() + " " + testing::python_tool() + " write " + file, status);
  ASSERT_EQ(status, 0);
  const auto got = ckpt::load_safetensors(file);
  for (const auto& [name, t] : python_written()) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(at::equal(got.at(name), t)) << name;
  }
}

TEST_F(Safetensors, PythonWrittenFileLoadsIntoRowShards) {
  const std::string file = dir_ + "/hf.safetensors";
  int status = 0;
  testing::run_command(testing::python() + " " + testing::python_tool() + " write " + file, status);
  ASSERT_EQ(status, 0);
  const auto ref = python_written();
  // Three "ranks", each loading its dim-0 rows (rank 2's slice of b.bias is one row).
  for (int rank = 0; rank < 3; ++rank) {
    ckpt::State state;
    std::map<std::string, at::Tensor> mine;
    for (const auto& [name, full] : ref) {
      const int64_t rows = full.size(0), per = (rows + 2) / 3;
      const int64_t begin = std::min(rows, rank * per), end = std::min(rows, begin + per);
      std::vector<int64_t> sizes = full.sizes().vec();
      sizes[0] = end - begin;
      mine[name] = at::zeros(sizes, full.options());
      std::vector<int64_t> offsets(full.dim(), 0);
      offsets[0] = begin;
      state[name] = ckpt::Entry::sharded(mine[name], offsets, full.sizes().vec());
    }
    ckpt::load_safetensors(state, file);
    for (const auto& [name, full] : ref) {
      const int64_t rows = full.size(0), per = (rows + 2) / 3;
      const int64_t begin = std::min(rows, rank * per), end = std::min(rows, begin + per);
      EXPECT_TRUE(at::equal(mine[name], full.slice(0, begin, end))) << name << " rank " << rank;
    }
  }
}

TEST_F(Safetensors, BadFilesNameTheFileAndTensor) {
  const std::string file = dir_ + "/m.safetensors";
  ckpt::save_safetensors({{"w", at::ones({64, 4})}}, file);
  ckpt::State state{{"w", at::zeros({64, 4})}};
  // Missing tensor, other shape, other dtype.
  ckpt::State missing{{"v", at::zeros({64, 4})}};
  EXPECT_NE(error_of([&] { ckpt::load_safetensors(missing, file); }).find("has no entry 'v'"), std::string::npos);
  ckpt::State shape{{"w", at::zeros({63, 4})}};
  EXPECT_NE(error_of([&] { ckpt::load_safetensors(shape, file); }).find("'w' is F32 [64, 4] there but F32 [63, 4]"),
            std::string::npos);
  ckpt::State dtype{{"w", at::zeros({64, 4}, at::kDouble)}};
  EXPECT_NE(error_of([&] { ckpt::load_safetensors(dtype, file); }).find("but F64 [64, 4]"), std::string::npos);
  // Truncated.
  fs::resize_file(file, fs::file_size(file) - 10);
  const std::string e = error_of([&] { ckpt::load_safetensors(state, file); });
  EXPECT_NE(e.find(file + " is truncated: tensor 'w'"), std::string::npos) << e;
  EXPECT_TRUE(at::equal(state["w"].tensor(), at::zeros({64, 4})));  // unchanged
  // Not a safetensors file at all.
  std::ofstream(file, std::ios::trunc) << "hello, this is not safetensors";
  EXPECT_NE(error_of([&] { ckpt::load_safetensors(state, file); }).find(file + " is not a safetensors file"),
            std::string::npos);
}

}  // namespace
}  // namespace fsdpp
