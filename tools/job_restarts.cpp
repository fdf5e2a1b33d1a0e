// An fsdpp-run job: attempts of all ranks, restarted after a failure up to --max-restarts
// times (torchrun's flag: a budget for the job, every rank restarted together), and the
// single-node store's loopback socket each attempt serves on.
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "common/loopback.h"
#include "launcher.h"

namespace fsdpp_run {

std::string why_not_restarted(const AttemptEnd& end, int restarts, const Options& options) {
  if (end.forwarded_signal != 0) return "fsdpp-run was told to stop";
  switch (end.exit_code) {
    case kUsageErrorExitCode:
      return "exit code " + std::to_string(kUsageErrorExitCode) + " is a usage error (a bad flag or a missing file)";
    case kCannotExecuteExitCode:
    case kNotFoundExitCode:
      return "the program cannot be executed";
    case kPreemptedExitCode:
      return "the ranks were preempted and saved their state (exit code " + std::to_string(kPreemptedExitCode) +
             "): the scheduler restarts or requeues the job";
    default:
      if (restarts == options.max_restarts)
        return "no restarts left (--max-restarts " + std::to_string(options.max_restarts) + ")";
      return "";
  }
}

int pending_stop_signal(int signal_fd) {
  signalfd_siginfo info;
  int stop = 0;
  while (read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info))
    if (info.ssi_signo != SIGCHLD) stop = static_cast<int>(info.ssi_signo);
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  return stop;
}

namespace {

// "attempt 1 of 3".
std::string attempt_name(int number, const Options& o) {
  return "attempt " + std::to_string(number + 1) + " of " + std::to_string(o.max_restarts + 1);
}

}  // namespace

int run_job(const Options& options) {
  if (options.elastic()) return run_elastic_job(options);  // supervises on its own
  sigset_t original_mask;
  const int signal_fd = start_supervising(original_mask);
  if (signal_fd < 0) return 1;
  // Only a single-node job meeting on loopback gets the launcher's own port; nodes (and a job
  // told to meet at another address) meet at --master-addr:--master-port.
  const bool own_port = options.nnodes == 1 && !options.master_port_given && fsdpp::is_loopback(options.master_addr);
  std::vector<AttemptEnd> ends;
  for (int number = 0;; ++number) {
    Attempt attempt;
    attempt.number = number;
    attempt.master_port = options.master_port;
    // A fresh socket per attempt: nothing a dead attempt's rank left queued reaches the next one.
    // 127.0.0.1 at a port the kernel picks: nothing another machine can reach, and never a port
    // another job holds (torchrun's --standalone picks a free port too, but then lets it go
    // before the ranks bind it). Rank 0's store serves on it.
    if (own_port && (attempt.store_listen_fd = listen_on("127.0.0.1", 0, attempt.master_port)) < 0) {
      say(std::string("cannot listen on a free port of 127.0.0.1 for the job's store: ") + strerror(errno));
      return 1;
    }
    ends.push_back(run_attempt(options, attempt, signal_fd, original_mask));
    if (attempt.store_listen_fd >= 0) close(attempt.store_listen_fd);
    const AttemptEnd& end = ends.back();
    if (end.exit_code == 0 || options.max_restarts == 0) break;  // done, or restarts were not asked for
    std::string why_not = why_not_restarted(end, number, options);
    if (why_not.empty()) {
      if (const int sig = pending_stop_signal(signal_fd)) {
        ends.back().forwarded_signal = sig;
        ends.back().exit_code = 128 + sig;
        why_not = "fsdpp-run received " + signal_name(sig);
      }
    }
    if (!why_not.empty()) {
      say(attempt_name(number, options) + " ended (" + end.reason + "); not restarted: " + why_not);
      break;
    }
    say(attempt_name(number, options) + " ended (" + end.reason + "); restarting all ranks (restart " +
        std::to_string(number + 1) + " of " + std::to_string(options.max_restarts) + ")");
  }
  if (options.max_restarts > 0)
    for (size_t i = 0; i < ends.size(); ++i)
      say("summary: " + attempt_name(static_cast<int>(i), options) + ": " + ends[i].reason + " (exit code " +
          std::to_string(ends[i].exit_code) + ")");
  return ends.back().exit_code;
}

}  // namespace fsdpp_run
