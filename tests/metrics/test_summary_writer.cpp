// fsdpp::SummaryWriter's event files, read back by TensorBoard itself (read_tensorboard.py).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "fsdpp/summary_writer.h"
#include "metrics/crc32c.h"
#include "metrics/event_file.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path make_temp_dir() {
  std::string templ = (fs::temp_directory_path() / "fsdpp-summary-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return templ;
}

struct TempDir {
  fs::path path = make_temp_dir();
  ~TempDir() { fs::remove_all(path); }
};

// The Python with tensorboard: $FSDPP_PYTHON, else the build's (tests/CMakeLists.txt).
std::string python() {
  if (const char* env = std::getenv("FSDPP_PYTHON"); env != nullptr && *env != '\0') return env;
#ifdef FSDPP_TEST_PYTHON
  return FSDPP_TEST_PYTHON;
#else
  return "";
#endif
}

struct TensorBoardView {
  int status = -1;  // the script's exit status; 77: tensorboard not importable, 127: no such Python
  json data;
};

// What TensorBoard shows for `log_dir` (read_tensorboard.py's JSON).
TensorBoardView read_with_tensorboard(const fs::path& log_dir) {
  const std::string script = (fs::path(__FILE__).parent_path() / "read_tensorboard.py").string();
  const std::string command = "'" + python() + "' '" + script + "' '" + log_dir.string() + "'";
  TensorBoardView view;
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return view;
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = pclose(pipe);
  view.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (view.status == 0) view.data = json::parse(out);
  return view;
}

#define READ_OR_SKIP(view, log_dir)                                                               \
  if (python().empty()) GTEST_SKIP() << "set FSDPP_PYTHON to a Python with tensorboard to run this"; \
  TensorBoardView view = read_with_tensorboard(log_dir);                                          \
  if (view.status == 77) GTEST_SKIP() << "tensorboard is not importable by " << python();        \
  if (view.status == 126 || view.status == 127) GTEST_SKIP() << "cannot run " << python();        \
  ASSERT_EQ(view.status, 0) << "read_tensorboard.py failed on " << log_dir;

double loss_at(int64_t step, double run) { return run + 10.0 / (1.0 + 0.37 * static_cast<double>(step)); }

}  // namespace

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(fsdpp::metrics::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(fsdpp::metrics::crc32c("", 0), 0u);
  // Continuing a CRC over a second piece equals the CRC of the whole.
  EXPECT_EQ(fsdpp::metrics::crc32c("6789", 4, fsdpp::metrics::crc32c("12345", 5)), 0xE3069283u);
}

TEST(EventFile, FramesARecord) {
  const std::string framed = fsdpp::metrics::frame_record("abc");
  ASSERT_EQ(framed.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(framed.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));  // little-endian length
  EXPECT_EQ(framed.substr(12, 3), "abc");
}

TEST(SummaryWriter, TensorBoardReadsTheScalarsAndTexts) {
  TempDir dir;
  const fs::path log_dir = dir.path / "runs" / "a";  // created with its parents
  std::string file;
  {
    fsdpp::SummaryWriter writer(log_dir.string(), fsdpp::SummaryWriterOptions().filename_suffix(".v1"));
    file = writer.file_path();
    for (int64_t step = 0; step < 50; ++step) writer.add_scalar("loss/train", loss_at(step, 0), step);
    for (int64_t step = 0; step < 50; step += 10) writer.add_scalar("lr", 3e-4 * step, step, 1.7e9 + step);
    writer.add_text("config", "layers: **4**", 0);
    writer.close();
  }
  const std::string name = fs::path(file).filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\..+\.\d+\.\d+\.v1)"))) << name;
  EXPECT_EQ(fs::path(file).parent_path(), log_dir);

  READ_OR_SKIP(view, log_dir);
  const json& loss = view.data.at("scalars").at("loss/train");
  ASSERT_EQ(loss.size(), 50u);
  for (int64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(loss[step]["step"].get<int64_t>(), step);
    EXPECT_EQ(loss[step]["value"].get<float>(), static_cast<float>(loss_at(step, 0)));
  }
  const json& lr = view.data["scalars"].at("lr");
  ASSERT_EQ(lr.size(), 5u);
  EXPECT_EQ(lr[3]["step"].get<int64_t>(), 30);
  EXPECT_EQ(lr[3]["value"].get<float>(), static_cast<float>(3e-4 * 30));
  EXPECT_DOUBLE_EQ(lr[3]["wall_time"].get<double>(), 1.7e9 + 30);
  const json& text = view.data.at("texts").at("config/text_summary");
  ASSERT_EQ(text.size(), 1u);
  EXPECT_EQ(text[0]["text"], "layers: **4**");

  // The first record says which format the file is in.
  const json& events = view.data.at("files").at(0).at("events");
  EXPECT_EQ(events[0]["file_version"], "brain.Event:2");
  EXPECT_GT(events[0]["wall_time"].get<double>(), 1.6e9);
  EXPECT_EQ(events.size(), 1u + 50u + 5u + 1u);
}

TEST(SummaryWriter, PurgeStepShowsEachStepOnceFromTheNewestRun) {
  TempDir dir;
  constexpr int64_t kResume = 6;
  {
    fsdpp::SummaryWriter first(dir.path.string());
    for (int64_t step = 0; step < 10; ++step) first.add_scalar("loss", loss_at(step, 0), step);
  }  // the destructor flushes
  {
    fsdpp::SummaryWriterOptions options;
    options.purge_step(kResume);
    fsdpp::SummaryWriter second(dir.path.string(), options);
    for (int64_t step = kResume; step < 13; ++step) second.add_scalar("loss", loss_at(step, 100), step);
  }
  READ_OR_SKIP(view, dir.path);
  const json& loss = view.data.at("scalars").at("loss");
  ASSERT_EQ(loss.size(), 13u) << loss.dump();
  for (int64_t step = 0; step < 13; ++step) {
    EXPECT_EQ(loss[step].at("step").get<int64_t>(), step);
    const double run = step < kResume ? 0 : 100;
    EXPECT_EQ(loss[step].at("value").get<float>(), static_cast<float>(loss_at(step, run))) << "step " << step;
  }
  // As PyTorch writes it: after the file_version record, one at purge_step, then SessionLog START.
  ASSERT_EQ(view.data.at("files").size(), 2u);
  const json& second_file = view.data["files"][1].at("events");
  ASSERT_GE(second_file.size(), 3u);
  EXPECT_EQ(second_file[1].value("file_version", ""), "brain.Event:2");
  EXPECT_EQ(second_file[1].at("step"), kResume);
  EXPECT_EQ(second_file[2].value("session_log", ""), "START");
  EXPECT_EQ(second_file[2].at("step"), kResume);
}

TEST(SummaryWriter, BuffersUntilFlushOrMaxQueue) {
  TempDir dir;
  fsdpp::SummaryWriterOptions options;
  options.max_queue(4);
  fsdpp::SummaryWriter writer(dir.path.string(), options);
  const auto header = fs::file_size(writer.file_path());
  EXPECT_GT(header, 0u);  // the file_version record is written at once
  for (int step = 0; step < 3; ++step) writer.add_scalar("x", step, step);
  EXPECT_EQ(fs::file_size(writer.file_path()), header);
  writer.flush();
  const auto flushed = fs::file_size(writer.file_path());
  EXPECT_GT(flushed, header);
  for (int step = 3; step < 7; ++step) writer.add_scalar("x", step, step);
  EXPECT_GT(fs::file_size(writer.file_path()), flushed);  // the 4th buffered event flushed them

  fsdpp::SummaryWriterOptions every_add;
  every_add.flush_secs(0);
  fsdpp::SummaryWriter eager(dir.path.string(), every_add);
  const auto eager_header = fs::file_size(eager.file_path());
  eager.add_scalar("x", 1, 1);
  EXPECT_GT(fs::file_size(eager.file_path()), eager_header);
}

TEST(SummaryWriter, AddAfterCloseThrows) {
  TempDir dir;
  fsdpp::SummaryWriter writer(dir.path.string());
  writer.close();
  writer.close();  // idempotent
  EXPECT_THROW(writer.add_scalar("x", 1, 1), std::runtime_error);
}

TEST(SummaryWriter, UncreatableLogDirThrowsNamingIt) {
  TempDir dir;
  const fs::path file = dir.path / "a-file";
  std::ofstream(file) << "not a folder";
  for (const fs::path& log_dir : {file / "runs", file}) {
    try {
      fsdpp::SummaryWriter writer(log_dir.string());
      ADD_FAILURE() << "no error for " << log_dir;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(log_dir.string()), std::string::npos) << e.what();
    }
  }
}

TEST(SummaryWriter, WriteFailureThrowsNamingTheFile) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  fsdpp::metrics::EventFile file("/dev/full");
  file.append("record");
  try {
    file.flush();
    ADD_FAILURE() << "writing to /dev/full did not fail";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
  }
}
