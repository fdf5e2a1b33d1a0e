#pragma once
// The fixture of fsdpp-run's tests: the real launcher binary run with a small `sh -c` program
// as the ranks, under a deadline so nothing can hang, its output captured.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef FSDPP_RUN_PATH
#error "define FSDPP_RUN_PATH to the fsdpp-run binary"
#endif

namespace fsdpp_run_test {


namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Outcome {
  int exit_code = -1;  // 128 + signal if the launcher was killed
  std::string out, err;
  double seconds = 0;
  bool timed_out = false;
};

// Where the launcher's stdout goes: a pipe, or a terminal (a pseudo-terminal we read).
enum class Stdout { kPipe, kTerminal };

// The launcher under test, started with its stdout and stderr captured.
class Launched {
 public:
  Launched(const std::vector<std::string>& args, const std::vector<std::string>& env,
           Stdout stdout_to = Stdout::kPipe) {
    int out[2], err[2];
    if (pipe2(err, O_CLOEXEC) != 0) std::abort();
    if (stdout_to == Stdout::kPipe ? pipe2(out, O_CLOEXEC) != 0
                                   : openpty(&out[0], &out[1], nullptr, nullptr, nullptr) != 0)
      std::abort();
    fcntl(out[0], F_SETFD, FD_CLOEXEC), fcntl(out[1], F_SETFD, FD_CLOEXEC);
    start_ = Clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      unsetenv("OMP_NUM_THREADS");  // the tests decide whether it is set
      for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(99);
    }
    close(out[1]);
    close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  Launched(const Launched&) = delete;
  Launched& operator=(const Launched&) = delete;

  ~Launched() {  // a failed assertion must not leave the launcher running
    if (pid_ > 0) finish(0);
  }

  pid_t pid() const { return pid_; }

  // Collects output until the launcher exits; SIGKILLs it at the deadline.
  Outcome finish(double deadline_seconds = 30) {
    Outcome o;
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      double left = deadline_seconds - seconds_since(start_);
      if (left <= 0) {
        kill(pid_, SIGKILL);
        o.timed_out = true;
        break;
      }
      pump(static_cast<int>(left * 1000) + 1, o);
    }
    close_fd(out_fd_);
    close_fd(err_fd_);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    o.exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    o.seconds = seconds_since(start_);
    return o;
  }

 private:
  void pump(int timeout_ms, Outcome& o) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    if (poll(fds, 2, timeout_ms) <= 0) return;
    read_into(out_fd_, fds[0].revents, o.out);
    read_into(err_fd_, fds[1].revents, o.err);
  }

  static void read_into(int& fd, short revents, std::string& text) {
    if (fd < 0 || revents == 0) return;
    char buf[65536];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0)
      text.append(buf, static_cast<size_t>(n));
    else if (n == 0 || errno != EINTR)  // a terminal's reader gets EIO once its writers are gone
      close_fd(fd);
  }

  static void close_fd(int& fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  Clock::time_point start_;
};

// A zombie is as good as gone: here PID 1 may never reap orphans.
inline bool alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t paren = text.rfind(')');
  return paren == std::string::npos || text.size() < paren + 3 || text[paren + 2] != 'Z';
}

// Waits up to `seconds` for every pid to be gone; returns those still alive.
inline std::vector<pid_t> survivors(const std::vector<pid_t>& pids, double seconds = 2) {
  auto start = Clock::now();
  for (;;) {
    std::vector<pid_t> left;
    for (pid_t p : pids)
      if (alive(p)) left.push_back(p);
    if (left.empty() || seconds_since(start) > seconds) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Shell snippets for the rank programs; $D is the test's temp dir.

// Publishes a value as $D/<name>.<rank>, atomically so readers never see a
// half-written file.
inline std::string publish(const std::string& name, const std::string& value) {
  std::string file = "\"$D/" + name + ".$RANK\"";
  return "echo " + value + " > " + file + ".tmp && mv " + file + ".tmp " + file + "; ";
}

// Waits until $D/<name>.<r> exists for each of `ranks`.
inline std::string await(const std::string& name, const std::vector<int>& ranks) {
  std::string all_exist = "true";
  for (int r : ranks) all_exist += " && [ -e \"$D/" + name + "." + std::to_string(r) + "\" ]";
  return "until " + all_exist + "; do sleep 0.02; done; ";
}

class Launcher : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "fsdpp-launcher-XXXXXX").string();
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Starts fsdpp-run with `flags` and `sh -c script` as the program.
  std::unique_ptr<Launched> start(const std::vector<std::string>& flags, const std::string& script,
                                  std::vector<std::string> env = {}) {
    std::vector<std::string> args{FSDPP_RUN_PATH};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"sh", "-c", script});
    env.push_back("D=" + dir_);
    return std::make_unique<Launched>(args, env);
  }

  Outcome run(const std::vector<std::string>& flags, const std::string& script,
              std::vector<std::string> env = {}) {
    return start(flags, script, std::move(env))->finish();
  }

  // PIDs published under `name` by the given ranks.
  std::vector<pid_t> pids(const std::string& name, const std::vector<int>& ranks) const {
    std::vector<pid_t> result;
    for (int r : ranks) {
      std::ifstream in(file(name, r));
      pid_t pid = 0;
      in >> pid;
      EXPECT_GT(pid, 0) << "no pid in " << file(name, r);
      if (pid > 0) result.push_back(pid);
    }
    return result;
  }

  // Waits up to `seconds` for $D/<name>.<r> to exist for each of `ranks`.
  bool wait_for(const std::string& name, const std::vector<int>& ranks, double seconds = 20) const {
    auto start = Clock::now();
    for (;;) {
      bool all = true;
      for (int r : ranks) all = all && fs::exists(file(name, r));
      if (all) return true;
      if (seconds_since(start) > seconds) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  std::string file(const std::string& name, int rank) const {
    return dir_ + "/" + name + "." + std::to_string(rank);
  }

  // Runs the launcher with bad `flags`; checks the program never started.
  Outcome run_refused(const std::vector<std::string>& flags, std::vector<std::string> env = {}) {
    Outcome o = run(flags, "touch \"$D/ran.$RANK\"", std::move(env));
    EXPECT_FALSE(o.timed_out);
    EXPECT_TRUE(fs::is_empty(dir_)) << "a rank ran despite " << ::testing::PrintToString(flags);
    return o;
  }

  // Sends `sig` to the launcher once both ranks are up; checks the ranks got
  // it, the launcher failed with 128+sig, and nothing is left.
  void check_forwarded(int sig, const std::string& name) {
    // The sleep starts before the rank says it is ready, and `wait` (unlike
    // a foreground command) lets the trap run as soon as the signal comes.
    auto script = "trap 'touch \"$D/got.$RANK\"; exit 0' " + name + "; sleep 60 & " +
                  publish("gc", "$!") + publish("pid", "$$") + "wait; exit 1";
    auto launcher = start({"--nproc-per-node", "2"}, script);
    ASSERT_TRUE(wait_for("pid", {0, 1}));
    kill(launcher->pid(), sig);
    Outcome o = launcher->finish();
    ASSERT_FALSE(o.timed_out);
    EXPECT_EQ(o.exit_code, 128 + sig);
    EXPECT_LT(o.seconds, 20);
    EXPECT_TRUE(contains(o.err, "received SIG" + name)) << o.err;
    EXPECT_TRUE(fs::exists(file("got", 0))) << "rank 0 missed SIG" << name;
    EXPECT_TRUE(fs::exists(file("got", 1))) << "rank 1 missed SIG" << name;
    EXPECT_EQ(survivors(pids("pid", {0, 1})), std::vector<pid_t>{});
    EXPECT_EQ(survivors(pids("gc", {0, 1})), std::vector<pid_t>{});
  }

  std::string dir_;
};

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace fsdpp_run_test
