// POSIX file helpers for checkpoints.
#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fsdpp/error.h>

namespace fsdpp::checkpoint::detail {

namespace {
std::string errno_text() { return std::strerror(errno); }

const char* file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// realpath(3), or "" when it fails.
std::string real_path(const std::string& path) {
  char* p = ::realpath(path.c_str(), nullptr);
  if (!p) return "";
  std::string out(p);
  std::free(p);
  return out;
}
}  // namespace

File File::open_read(const std::string& path, const std::string& inside_dir) {
  // An O_PATH descriptor neither blocks (a FIFO with no writer would, forever) nor opens a
  // device; what it names is checked before the file is opened for reading.
  File probe;
  probe.path_ = path;
  probe.fd_ = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (probe.fd_ < 0) throw Error("cannot open " + path + ": " + errno_text());
  struct stat want {};
  if (::fstat(probe.fd_, &want) != 0) throw Error("cannot stat " + path + ": " + errno_text());
  if (!S_ISREG(want.st_mode))
    throw Error(path + " is " + file_type(want.st_mode) + ", not a regular file; refusing to read it");
  if (!inside_dir.empty()) {
    const std::string root = real_path(inside_dir), target = real_path(path);
    const std::string prefix = root == "/" ? root : root + "/";
    if (root.empty() || target.empty() || target.compare(0, prefix.size(), prefix) != 0)
      throw Error(path + " leads outside the checkpoint directory " + inside_dir + " (to " +
                  (target.empty() ? "an unresolvable path" : target) +
                  "); a checkpoint's files may not be links out of it, refusing to read it");
  }
  File f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f.fd_ < 0) throw Error("cannot open " + path + ": " + errno_text());
  struct stat got {};
  if (::fstat(f.fd_, &got) != 0) throw Error("cannot stat " + path + ": " + errno_text());
  if (got.st_dev != want.st_dev || got.st_ino != want.st_ino)
    throw Error(path + " changed while it was being opened; refusing to read it");
  ::fcntl(f.fd_, F_SETFL, ::fcntl(f.fd_, F_GETFL) & ~O_NONBLOCK);
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

std::string read_text_file(const std::string& path, const std::string& inside_dir) {
  File f = File::open_read(path, inside_dir);
  std::string text(static_cast<size_t>(f.size()), '\0');
  f.pread_exact(text.data(), static_cast<int64_t>(text.size()), 0, "the whole file");
  return text;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

}  // namespace fsdpp::checkpoint::detail
