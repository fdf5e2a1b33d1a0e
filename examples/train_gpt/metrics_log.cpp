#include "metrics_log.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace train_gpt {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int err = 0) {
  const std::string why = err != 0 ? std::string(": ") + std::strerror(err) : "";
  throw std::runtime_error("metrics log " + path + ": " + what + why);
}

// One line of JSON. Invalid UTF-8 in a string is replaced, not thrown: a metric is not worth
// stopping a run for.
std::string dump(const nlohmann::json& record) {
  return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool has_integer_step(const nlohmann::json& record) {
  return record.is_object() && record.contains("step") && record["step"].is_number_integer();
}

// The lines of `text` worth keeping, each ending in '\n'.
std::string kept_lines(const std::string& text, int64_t resume_step) {
  std::string kept;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (has_integer_step(record) && record["step"].get<int64_t>() <= resume_step) kept += line + "\n";
  }
  return kept;
}

std::string read_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) fail(path, "cannot read it", errno);
  std::string text;
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, n);
  const int err = std::ferror(file) ? errno : 0;
  std::fclose(file);
  if (err != 0) fail(path, "cannot read it", err);
  return text;
}

// Replaces `path` by `contents` so that a crash leaves either the old file or the new one.
void replace_file(const std::string& path, const std::string& contents) {
  const std::string temp = path + ".tmp-" + std::to_string(getpid());
  std::FILE* file = std::fopen(temp.c_str(), "wb");
  if (file == nullptr) fail(path, "cannot create " + temp, errno);
  const bool written = std::fwrite(contents.data(), 1, contents.size(), file) == contents.size() &&
                       std::fflush(file) == 0 && fsync(fileno(file)) == 0;
  const int err = errno;
  if (std::fclose(file) != 0 || !written) {
    std::remove(temp.c_str());
    fail(path, "cannot write " + temp, err);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    std::remove(temp.c_str());
    fail(path, "cannot rename " + temp + " onto it", rename_err);
  }
}

}  // namespace

MetricsLog::MetricsLog(std::string path, int64_t resume_step) : path_(std::move(path)) {
  if (path_.empty()) return;
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path parent = fs::path(path_).parent_path();
  if (!parent.empty()) fs::create_directories(parent, error);
  if (error) fail(path_, "cannot create its folder " + parent.string() + ": " + error.message());

  if (fs::exists(path_, error)) {
    const std::string text = read_file(path_);
    const std::string kept = kept_lines(text, resume_step);
    if (kept != text) replace_file(path_, kept);  // also ends a torn last line
  }
  file_ = std::fopen(path_.c_str(), "ab");
  if (file_ == nullptr) fail(path_, "cannot open it for appending", errno);
}

MetricsLog::~MetricsLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (file_ == nullptr) return;
  if (!has_integer_step(record)) fail(path_, "a record needs an integer \"step\": " + dump(record));
  const std::string line = dump(record) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    fail(path_, "cannot write it", errno);
  }
}

}  // namespace train_gpt
