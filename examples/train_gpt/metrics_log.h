#pragma once
// The trainer's metrics as JSON lines, one record per line, each with an integer "step".
// A resumed run drops the lines of the steps it is about to redo, so no step appears twice.
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace train_gpt {

class MetricsLog {
 public:
  // An empty path disables the log. Otherwise keeps the existing file's lines whose "step" is
  // <= resume_step (a run from scratch passes -1 and keeps none) and appends after them. Lines
  // that are not JSON objects with an integer "step" (a line torn by a kill) are dropped.
  // Throws std::runtime_error naming the file if it cannot be read, rewritten or opened.
  MetricsLog(std::string path, int64_t resume_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  bool enabled() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  // Appends `record` (an object with an integer "step") as one line and flushes it to the OS.
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace train_gpt
