#include "metrics/event_file.h"

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "fsdpp/error.h"
#include "metrics/crc32c.h"

namespace fsdpp::metrics {
namespace {

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

std::string os_error(const std::string& what, const std::string& path, int err) {
  return what + " " + path + ": " + std::strerror(err);
}

}  // namespace

std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out.append(data);
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

EventFile::EventFile(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) throw Error(os_error("cannot create the event file", path_, errno));
}

EventFile::~EventFile() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventFile::append(std::string_view record) {
  if (file_ == nullptr) throw Error("event file " + path_ + " is closed");
  buffer_ += frame_record(record);
  ++pending_records_;
}

void EventFile::flush() {
  if (file_ == nullptr) return;
  errno = 0;
  const bool written = std::fwrite(buffer_.data(), 1, buffer_.size(), file_) == buffer_.size();
  if (!written || std::fflush(file_) != 0) {
    const int err = errno != 0 ? errno : EIO;
    // Drop what could not be written: retrying would duplicate a partly written record.
    buffer_.clear();
    pending_records_ = 0;
    throw Error(os_error("cannot write the event file", path_, err));
  }
  buffer_.clear();
  pending_records_ = 0;
}

void EventFile::close() {
  if (file_ == nullptr) return;
  std::FILE* file = file_;
  try {
    flush();
  } catch (...) {
    file_ = nullptr;
    std::fclose(file);
    throw;
  }
  file_ = nullptr;
  if (std::fclose(file) != 0) throw Error(os_error("cannot close the event file", path_, errno));
}

}  // namespace fsdpp::metrics
