// POSIX file helpers for checkpoints.
#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fsdpp/error.h>

namespace fsdpp::checkpoint::detail {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

File File::open_read(const std::string& path) {
  File f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) throw Error("cannot open " + path + ": " + errno_text());
  return f;
}

File File::create(const std::string& path) {
  File f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd_ < 0) throw Error("cannot create " + path + ": " + errno_text());
  return f;
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw Error("cannot stat " + path_ + ": " + errno_text());
  return static_cast<int64_t>(st.st_size);
}

void File::pread_exact(void* data, int64_t size, int64_t offset, const std::string& what) const {
  auto* p = static_cast<char*>(data);
  int64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd_, p + done, static_cast<size_t>(size - done), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("reading " + what + " from " + path_ + " failed: " + errno_text());
    if (n == 0)
      throw Error(path_ + " is truncated: " + what + " needs bytes [" + std::to_string(offset) + ", " +
                  std::to_string(offset + size) + ") but the file ends at byte " + std::to_string(offset + done));
    done += n;
  }
}

void File::write_all(const void* data, int64_t size, const std::string& what) {
  const auto* p = static_cast<const char*>(data);
  int64_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, p + done, static_cast<size_t>(size - done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("writing " + what + " to " + path_ + " failed: " + errno_text());
    done += n;
  }
}

void File::sync() {
  if (::fsync(fd_) != 0) throw Error("fsync of " + path_ + " failed: " + errno_text());
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open directory " + dir + ": " + errno_text());
  const int rc = ::fsync(fd);
  const std::string err = errno_text();
  ::close(fd);
  if (rc != 0) throw Error("fsync of directory " + dir + " failed: " + err);
}

void write_file_atomically(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string final_path = dir + "/" + name;
  const std::string tmp = final_path + ".tmp";
  {
    File f = File::create(tmp);
    f.write_all(text.data(), static_cast<int64_t>(text.size()), name);
    f.sync();
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0)
    throw Error("cannot rename " + tmp + " to " + final_path + ": " + errno_text());
  fsync_dir(dir);
}

std::string read_text_file(const std::string& path) {
  File f = File::open_read(path);
  std::string text(static_cast<size_t>(f.size()), '\0');
  f.pread_exact(text.data(), static_cast<int64_t>(text.size()), 0, "the whole file");
  return text;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

}  // namespace fsdpp::checkpoint::detail
