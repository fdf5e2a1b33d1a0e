#pragma once
// POSIX file helpers whose errors name the file: positioned reads, checked writes, fsync, and
// opening files of a checkpoint that may be hostile (a FIFO, a device, a link leaving it).
#include <cstdint>
#include <string>

namespace fsdpp::checkpoint::detail {

// An open file descriptor, closed on destruction.
class File {
 public:
  // Only a regular file opens, without blocking or side effects first (a FIFO or a device
  // is refused, not opened). With `inside_dir`, the file must also lie inside that directory
  // once links are followed (a checkpoint's links may not leave it).
  static File open_read(const std::string& path, const std::string& inside_dir = "");
  static File create(const std::string& path);  // truncates; mode 0644
  File() = default;
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  int64_t size() const;
  // Reads exactly `size` bytes at `offset`; throws naming the file (and `what`) on a short read.
  void pread_exact(void* data, int64_t size, int64_t offset, const std::string& what) const;
  void write_all(const void* data, int64_t size, const std::string& what);
  void sync();
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

void fsync_dir(const std::string& dir);
// Writes `text` to dir/name through dir/name.tmp: write, fsync, rename, fsync(dir).
void write_file_atomically(const std::string& dir, const std::string& name, const std::string& text);
std::string read_text_file(const std::string& path, const std::string& inside_dir = "");
// rm -rf, ignoring errors (cleanup only).
void remove_tree(const std::string& path);

}  // namespace fsdpp::checkpoint::detail
