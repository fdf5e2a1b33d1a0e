// train_gpt::MetricsLog: JSON lines that a resumed run continues without repeating a step.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "metrics/temp_dir.h"
#include "train_gpt/metrics_log.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using fsdpp::testing::read_all;
using fsdpp::testing::TempDir;

// The "step" of each line (every line must be JSON).
std::vector<int64_t> steps(const fs::path& path) {
  std::vector<int64_t> out;
  std::istringstream lines(read_all(path));
  for (std::string line; std::getline(lines, line);) out.push_back(json::parse(line).at("step").get<int64_t>());
  return out;
}

void write_steps(train_gpt::MetricsLog& log, std::vector<int64_t> steps, double run) {
  for (int64_t step : steps) log.write({{"step", step}, {"loss", run + 1.0 / static_cast<double>(step)}});
}

}  // namespace

TEST(MetricsLog, ResumeRewritesTheRedoneSteps) {
  TempDir dir;
  const fs::path path = dir.path / "logs" / "metrics.jsonl";  // its folder is created
  {
    train_gpt::MetricsLog log(path.string(), -1);
    EXPECT_TRUE(log.enabled());
    write_steps(log, {10, 20, 30}, 0);
    EXPECT_EQ(steps(path), (std::vector<int64_t>{10, 20, 30}));  // each write is flushed
  }
  {
    train_gpt::MetricsLog log(path.string(), 20);
    EXPECT_EQ(steps(path), (std::vector<int64_t>{10, 20}));
    write_steps(log, {30, 40}, 100);
  }
  EXPECT_EQ(steps(path), (std::vector<int64_t>{10, 20, 30, 40}));
  std::istringstream lines(read_all(path));
  std::string line;
  for (int i = 0; i < 3; ++i) std::getline(lines, line);
  EXPECT_DOUBLE_EQ(json::parse(line).at("loss").get<double>(), 100 + 1.0 / 30);  // the resumed run's
  for (const auto& entry : fs::directory_iterator(path.parent_path())) {
    EXPECT_EQ(entry.path(), path) << "a temporary file was left behind";
  }
}

TEST(MetricsLog, TornLastLineIsDropped) {
  TempDir dir;
  const fs::path path = dir.path / "metrics.jsonl";
  std::ofstream(path) << "{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"loss\":2.4}\n{\"step\":3,\"lo";
  {
    train_gpt::MetricsLog log(path.string(), 100);
    write_steps(log, {3}, 0);
  }
  EXPECT_EQ(steps(path), (std::vector<int64_t>{1, 2, 3}));

  // A last line cut just before its newline is whole JSON: kept, and ended before the next.
  std::ofstream(path) << "{\"step\":1}\n{\"step\":2}";
  {
    train_gpt::MetricsLog log(path.string(), 100);
    write_steps(log, {3}, 0);
  }
  EXPECT_EQ(steps(path), (std::vector<int64_t>{1, 2, 3}));
}

TEST(MetricsLog, UntouchedWhenNothingIsDropped) {
  TempDir dir;
  const fs::path path = dir.path / "metrics.jsonl";
  std::ofstream(path) << "{\"step\":1}\n";
  struct stat before {}, after {};
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  train_gpt::MetricsLog log(path.string(), 5);
  ASSERT_EQ(stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);  // not replaced by a rewrite
}

TEST(MetricsLog, EmptyPathIsDisabled) {
  train_gpt::MetricsLog log("", 0);
  EXPECT_FALSE(log.enabled());
  log.write({{"step", 1}});  // does nothing
}

TEST(MetricsLog, RecordWithoutIntegerStepThrows) {
  TempDir dir;
  train_gpt::MetricsLog log((dir.path / "m.jsonl").string(), -1);
  EXPECT_THROW(log.write({{"loss", 1.0}}), std::runtime_error);
  EXPECT_THROW(log.write({{"step", 1.5}}), std::runtime_error);
  EXPECT_THROW(log.write(json::array({1, 2})), std::runtime_error);
}

TEST(MetricsLog, BadPathErrorNamesIt) {
  TempDir dir;
  const fs::path file = dir.path / "a-file";
  std::ofstream(file) << "x";
  for (const fs::path& path : {file / "metrics.jsonl", dir.path}) {  // under a file; a folder
    try {
      train_gpt::MetricsLog log(path.string(), 0);
      ADD_FAILURE() << "no error for " << path;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
  }
}
