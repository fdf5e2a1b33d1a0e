#include "harness/multi_process.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <fsdpp/collectives.h>

#include "comm/device_handoff.h"
#include <fsdpp/error.h>

namespace fsdpp::testing {

std::string default_test_backend() {
  const char* backend = std::getenv("FSDPP_TEST_BACKEND");
  return backend && *backend ? backend : "gloo";
}

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* env_or_null(const char* name) { return std::getenv(name); }

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string tail_lines(const std::string& text, int lines) {
  size_t pos = text.size();
  for (int i = 0; i <= lines; ++i) {
    if (pos == 0) return text;
    pos = text.rfind('\n', pos - 1);
    if (pos == std::string::npos) return text;
  }
  return text.substr(pos + 1);
}

// Collects this rank's gtest failures to report them to the parent.
class FailureCollector : public ::testing::EmptyTestEventListener {
 public:
  std::vector<std::string> failures;
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::ostringstream out;
    out << (result.file_name() ? result.file_name() : "?") << ":" << result.line_number() << ": " << result.message();
    failures.push_back(out.str());
  }
};

[[noreturn]] void run_as_rank(int rank, int world_size, const std::string& dir,
                              const std::function<void(RankContext&)>& body, const RunOptions& options) {
  RankContext ctx;
  ctx.rank = rank;
  ctx.world_size = world_size;
  ctx.temp_dir = dir;
  ctx.store_path = ctx.temp_dir + "/store";
  auto* collector = new FailureCollector;  // owned by gtest's listener list
  ::testing::UnitTest::GetInstance()->listeners().Append(collector);
  std::string uncaught;
  try {
    if (options.init_process_group) {
      ctx.world = init_process_group(InitProcessGroupOptions()
                                         .backend(options.backend)
                                         .init_method("file://" + ctx.store_path)
                                         .rank(ctx.rank)
                                         .world_size(world_size)
                                         .timeout(options.collective_timeout)
                                         .check_collectives(options.check_collectives));
    }
    body(ctx);
    // Finish together: a rank that exits early would cut connections its peers still use.
    // If this fails, a peer failed, and that peer reports its own failure.
    if (ctx.world.defined() && collector->failures.empty()) {
      try {
        barrier(ctx.world);
      } catch (const std::exception& e) {
        std::cerr << "final barrier: " << e.what() << "\n";
      }
    }
  } catch (const std::exception& e) {
    uncaught = std::string("uncaught exception: ") + e.what();
  } catch (...) {
    uncaught = "uncaught non-standard exception";
  }
  std::ofstream out(ctx.temp_dir + "/rank" + std::to_string(ctx.rank) + ".result");
  for (const auto& f : collector->failures) out << f << "\n";
  if (!uncaught.empty()) out << uncaught << "\n";
  out.close();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  // Skip destructors: peers may already be gone, and c10d teardown could then block.
  _exit(collector->failures.empty() && uncaught.empty() ? 0 : 1);
}

// A rank that dies of a signal says where, into its log (what the failure message quotes), then
// dies of it as it would have.
void print_backtrace_and_die(int sig) {
  char line[96];
  const int n = std::snprintf(line, sizeof line, "rank process %d died of signal %d (%s); backtrace:\n",
                              static_cast<int>(getpid()), sig, strsignal(sig));
  if (n > 0) (void)!write(2, line, static_cast<size_t>(n));
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

void backtrace_on_fatal_signals() {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc now: not in the handler
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) signal(sig, print_backtrace_and_die);
}

// Where a failing rank's whole log is copied, when FSDPP_TEST_FAILED_LOGS names a folder (the
// GPU script's $OUT): the failure message quotes only its last lines.
void keep_failed_log(const std::string& dir, int rank) {
  const char* keep = std::getenv("FSDPP_TEST_FAILED_LOGS");
  if (keep == nullptr || *keep == '\0') return;
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = test ? std::string(test->test_suite_name()) + "." + test->name() : "unknown";
  for (char& c : name)
    if (c == '/') c = '_';
  std::error_code ignored;
  fs::create_directories(keep, ignored);
  fs::copy_file(fs::path(dir) / ("rank" + std::to_string(rank) + ".log"),
                fs::path(keep) / (name + ".rank" + std::to_string(rank) + ".log"), fs::copy_options::overwrite_existing,
                ignored);
}

// The rank is a fork of the test process, not a re-executed binary: loading libtorch again costs
// about a second of CPU per rank, which was most of the suite's time. The parent runs no
// collectives (only its children do), so it holds no threads mid-collective to fork from; an
// OpenMP pool it may have started in an earlier test is left behind (one thread per rank, below).
// The child runs the body and _exits without returning.
pid_t spawn_rank(int rank, int world_size, const std::string& dir,
                 const std::function<void(RankContext&)>& body, const RunOptions& options) {
  const std::string log = dir + "/rank" + std::to_string(rank) + ".log";
  const pid_t parent = getpid();
  const bool threads_from_environment = env_or_null("OMP_NUM_THREADS") != nullptr;
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);  // or the child would print the parent's buffered output again
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid > 0) return pid;
  // Child: its own process group (so its descendants can be killed), dies with the parent.
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(99);
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);
  // One intra-op thread per rank unless asked otherwise: N ranks share the machine's cores.
  // (OMP_NUM_THREADS was read when the parent loaded OpenMP; a forked child sets it in code.)
  if (!threads_from_environment) at::set_num_threads(1);
  for (const auto& kv : options.env) putenv(strdup(kv.c_str()));
  backtrace_on_fatal_signals();
  // Suites run again over the NCCL-contract double delay every device collective's end.
  if (const char* us = env_or_null("FSDPP_TEST_COLLECTIVE_DELAY_US"))
    detail::set_device_collective_delay(std::chrono::microseconds(std::atoll(us)));
  run_as_rank(rank, world_size, dir, body, options);
}

struct RankProcess {
  pid_t pid = -1;
  bool running = true;
  int status = 0;
};

void kill_group(pid_t pid, int sig) { kill(-pid, sig); }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("died of signal ") + strsignal(WTERMSIG(status));
  return "ended";
}

}  // namespace

void run_ranks(int world_size, const std::function<void(RankContext&)>& body, const RunOptions& options) {
  char pattern[] = "/tmp/fsdpp-test-XXXXXX";
  const std::string dir = mkdtemp(pattern);
  std::vector<RankProcess> ranks(world_size);
  for (int r = 0; r < world_size; ++r) ranks[r].pid = spawn_rank(r, world_size, dir, body, options);

  const auto start = Clock::now();
  const auto grace = std::chrono::seconds(3);
  Clock::time_point first_failure{};
  bool timed_out = false;
  for (int alive = world_size; alive > 0;) {
    for (auto& p : ranks) {
      if (!p.running) continue;
      if (waitpid(p.pid, &p.status, WNOHANG) == p.pid) {
        p.running = false;
        --alive;
        kill_group(p.pid, SIGKILL);  // its descendants, if any
        bool ok = WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0;
        if (!ok && first_failure == Clock::time_point{}) first_failure = Clock::now();
      }
    }
    const auto now = Clock::now();
    // A failed rank leaves its peers blocked in collectives: give them a moment to report
    // their own errors, then stop them.
    bool stop_after_failure = first_failure != Clock::time_point{} && now - first_failure > grace;
    if (alive > 0 && (now - start > options.deadline || stop_after_failure)) {
      timed_out = now - start > options.deadline;
      for (auto& p : ranks)
        if (p.running) kill_group(p.pid, SIGKILL);
      for (auto& p : ranks)
        if (p.running) waitpid(p.pid, &p.status, 0);
      for (auto& p : ranks)
        if (p.running) p.status = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  for (int r = 0; r < world_size; ++r) {
    const auto& p = ranks[r];
    const fs::path result = fs::path(dir) / ("rank" + std::to_string(r) + ".result");
    const std::string log = tail_lines(read_file(fs::path(dir) / ("rank" + std::to_string(r) + ".log")), 15);
    const bool ok = !p.running && WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0;
    if (!ok) keep_failed_log(dir, r);
    if (p.running && timed_out) {
      ADD_FAILURE() << "rank " << r << " of " << world_size << " did not finish within the deadline of "
                    << options.deadline.count() << " s (killed). Its last output:\n" << log;
      continue;
    }
    if (p.running) {  // stopped after another rank failed: that rank's report says why
      std::cerr << "rank " << r << " of " << world_size << " was stopped after another rank failed\n";
      continue;
    }
    if (ok) continue;
    std::string failures = fs::exists(result) ? read_file(result) : "";
    ADD_FAILURE() << "rank " << r << " of " << world_size << " failed (" << describe_status(p.status) << "):\n"
                  << (failures.empty() ? "(no failure recorded) last output:\n" + log : failures);
  }
  std::error_code ignored;
  fs::remove_all(dir, ignored);
}

}  // namespace fsdpp::testing
