#pragma once
// A small file system for disk-full tests: the current test runs again in a child process that
// has its own mount namespace with a tmpfs of a given size mounted on a fresh directory. The
// gtest process itself never changes namespace (in a chroot that would break paths of files it
// already has open), nothing is ever mounted where the host sees it, and the tmpfs goes away
// with the child whatever happens. Needs root (CAP_SYS_ADMIN); otherwise the test skips.
//
//   TEST(Suite, Name) {
//     if (!testing::on_small_file_system()) {
//       const std::string why = testing::rerun_on_small_file_system(1 << 20);
//       if (!why.empty()) GTEST_SKIP() << why;
//       return;
//     }
//     ... testing::small_file_system_root() is the tmpfs; run_ranks' ranks see it too ...
//   }
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace fsdpp::testing {

constexpr const char* kSmallFileSystemVariable = "FSDPP_TEST_SMALL_FS";

// True in the child (and in the ranks it starts): the tmpfs is mounted.
inline bool on_small_file_system() { return std::getenv(kSmallFileSystemVariable) != nullptr; }
inline std::string small_file_system_root() { return std::getenv(kSmallFileSystemVariable); }

// Bytes free and in all on the file system at `path` (-1 when statvfs fails).
inline int64_t free_bytes(const std::string& path) {
  struct statvfs s {};
  return ::statvfs(path.c_str(), &s) == 0 ? static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize) : -1;
}
inline int64_t total_bytes(const std::string& path) {
  struct statvfs s {};
  return ::statvfs(path.c_str(), &s) == 0 ? static_cast<int64_t>(s.f_blocks) * static_cast<int64_t>(s.f_frsize) : -1;
}

// Runs the current test in a child with the tmpfs; its failures are printed by the child and
// reported here. Returns why it could not run ("" when it ran).
inline std::string rerun_on_small_file_system(int64_t bytes, std::chrono::seconds deadline = std::chrono::seconds(240)) {
  if (::geteuid() != 0) return "mounting a small tmpfs needs root (this runs as uid " + std::to_string(::geteuid()) + ")";
  char pattern[] = "/tmp/fsdpp-small-fs-XXXXXX";
  if (!::mkdtemp(pattern)) return std::string("mkdtemp failed: ") + std::strerror(errno);
  const std::string root = pattern;
  // Everything the child needs is made here: between fork and exec it only makes system calls.
  const std::string options = "size=" + std::to_string(bytes) + ",mode=0755";
  // Mounts must not propagate out: "/" recursively private, or (in a chroot, where "/" is not
  // a mount point) the nearest mount point above the directory.
  std::vector<std::string> privatize{"/"};
  for (auto p = std::filesystem::path(root).parent_path(); p != p.root_path(); p = p.parent_path())
    privatize.push_back(p.string());
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  std::vector<std::string> env_strings{std::string(kSmallFileSystemVariable) + "=" + root};
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp, argv{const_cast<char*>("/proc/self/exe"), const_cast<char*>(filter.c_str()), nullptr};
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return std::string("pipe failed: ") + std::strerror(errno);

  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(report[0]);
    auto fail = [&](int step) {
      const int what[2] = {step, errno};
      (void)!::write(report[1], what, sizeof(what));
      ::_exit(77);
    };
    if (::unshare(CLONE_NEWNS) != 0) fail(1);
    bool made_private = false;
    for (const auto& p : privatize)
      if (!made_private && ::mount(nullptr, p.c_str(), nullptr, MS_REC | MS_PRIVATE, nullptr) == 0) made_private = true;
    if (!made_private) fail(2);
    if (::mount("tmpfs", root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) fail(3);
    ::execve(argv[0], argv.data(), envp.data());
    fail(4);
  }
  ::close(report[1]);
  std::string why;
  if (pid < 0) {
    why = std::string("fork failed: ") + std::strerror(errno);
  } else {
    int status = 0;
    const auto start = std::chrono::steady_clock::now();
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() - start > deadline) {
        ::kill(pid, SIGKILL);  // its ranks die with it (PR_SET_PDEATHSIG)
        ::waitpid(pid, &status, 0);
        ADD_FAILURE() << "the run on a small file system did not finish within " << deadline.count() << " s";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    int what[2] = {0, 0};
    if (::read(report[0], what, sizeof(what)) == static_cast<ssize_t>(sizeof(what))) {
      const char* steps[] = {"", "cannot make a private mount namespace", "cannot make mounts private",
                             "cannot mount a tmpfs", "cannot re-run the test binary"};
      why = std::string(steps[what[0]]) + " (" + options + " on " + root + "): " + std::strerror(what[1]);
    } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      ADD_FAILURE() << "the run on a small file system failed (its output is above): "
                    << (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                          : std::string("killed by a signal"));
    }
  }
  ::close(report[0]);
  ::rmdir(root.c_str());
  return why;
}

}  // namespace fsdpp::testing
