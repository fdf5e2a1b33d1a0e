#pragma once
// A small file system for disk-full tests: a tmpfs of a given size, mounted in a private mount
// namespace of the test process (nothing leaks to the host, and the mount goes away with the
// process even if the test dies). Needs root (CAP_SYS_ADMIN); otherwise skip_reason() says why.
// Create it in the test's parent process, before run_ranks: rank processes inherit the mount
// (pass path() to them through RunOptions::env).
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace fsdpp::testing {

class SmallFileSystem {
 public:
  explicit SmallFileSystem(int64_t bytes) {
    if (::geteuid() != 0) {
      skip_reason_ = "mounting a small tmpfs needs root (this runs as uid " + std::to_string(::geteuid()) + ")";
      return;
    }
    if (::unshare(CLONE_NEWNS) != 0) {
      skip_reason_ = std::string("cannot make a private mount namespace: ") + std::strerror(errno);
      return;
    }
    // Mounts made from here on stay in this namespace, whatever the host's propagation is.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      skip_reason_ = std::string("cannot make mounts private: ") + std::strerror(errno);
      return;
    }
    char pattern[] = "/tmp/fsdpp-small-fs-XXXXXX";
    if (!::mkdtemp(pattern)) {
      skip_reason_ = std::string("mkdtemp failed: ") + std::strerror(errno);
      return;
    }
    path_ = pattern;
    const std::string options = "size=" + std::to_string(bytes) + ",mode=0755";
    if (::mount("tmpfs", path_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
      skip_reason_ = "cannot mount a tmpfs of " + std::to_string(bytes) + " bytes on " + path_ + ": " +
                     std::strerror(errno);
      ::rmdir(path_.c_str());
      path_.clear();
      return;
    }
    mounted_ = true;
  }
  SmallFileSystem(const SmallFileSystem&) = delete;
  SmallFileSystem& operator=(const SmallFileSystem&) = delete;
  ~SmallFileSystem() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    if (!path_.empty()) ::rmdir(path_.c_str());
  }

  bool ok() const { return mounted_; }
  const std::string& skip_reason() const { return skip_reason_; }
  const std::string& path() const { return path_; }

  // Bytes free and in all on the file system at `path` (-1 when statvfs fails).
  static int64_t free_bytes(const std::string& path) {
    struct statvfs s {};
    return ::statvfs(path.c_str(), &s) == 0 ? static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize) : -1;
  }
  static int64_t total_bytes(const std::string& path) {
    struct statvfs s {};
    return ::statvfs(path.c_str(), &s) == 0 ? static_cast<int64_t>(s.f_blocks) * static_cast<int64_t>(s.f_frsize) : -1;
  }

 private:
  std::string path_, skip_reason_;
  bool mounted_ = false;
};

}  // namespace fsdpp::testing
