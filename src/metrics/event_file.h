#pragma once
// One TensorBoard event file: TFRecord framing of serialized Event protos, buffered in memory
// until flush(). A record is
//   uint64 length (little-endian) | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
// so a reader can tell a record torn by a crash from a whole one.
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace fsdpp::metrics {

// The framed bytes of one record (exposed for the tests).
std::string frame_record(std::string_view data);

class EventFile {
 public:
  // Creates (or truncates) `path`; throws fsdpp::Error naming it if it cannot.
  explicit EventFile(std::string path);
  ~EventFile();  // closes without writing what is still buffered; call close() first
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;

  void append(std::string_view record);
  // Writes the buffered records and hands them to the OS; throws naming the file on failure.
  void flush();
  void close();  // flush() then close; idempotent

  const std::string& path() const { return path_; }
  size_t pending_records() const { return pending_records_; }
  bool is_open() const { return file_ != nullptr; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::string buffer_;
  size_t pending_records_ = 0;
};

}  // namespace fsdpp::metrics
