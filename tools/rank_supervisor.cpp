// One attempt of an fsdpp-run job: this node's ranks started with torchrun's environment, their
// output relayed (output_relay.h), reaped, and all stopped when one fails, when the launcher is
// signalled, or when they outstay a clean exit (see --help in fsdpp_run.cpp).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launcher.h"
#include "output_relay.h"
#include "run_summary.h"

namespace fsdpp_run {

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);  // null for real-time signals
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

namespace {

// ---------------------------------------------------------------- ranks

struct Rank {
  int rank = 0;
  pid_t pid = -1;  // also its process group id
  bool running = false;
  Stream out, err;
  int status = 0;              // from waitpid, once it is no longer running
  bool stopped_by_us = false;  // still running when the job was stopped
  char state_at_stop = '?';    // its /proc state at that moment
};

// A pipe whose read end is non-blocking (we poll it) and whose ends are
// close-on-exec, so no rank inherits another rank's pipe and EOF still works.
bool open_pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  return true;
}

void set_rank_env(const Options& o, const Attempt& a, int local_rank) {
  auto set = [](const char* name, const std::string& value) { setenv(name, value.c_str(), 1); };
  set("RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank));
  set("WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node));
  set("LOCAL_RANK", std::to_string(local_rank));
  set("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node));
  set("GROUP_RANK", std::to_string(o.node_rank));
  set("MASTER_ADDR", o.master_addr);
  set("MASTER_PORT", std::to_string(a.master_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(a.number));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts));
  set("FSDPP_RESTART_COUNT", std::to_string(a.number));
  if (a.agent_store) {  // every rank a client of the launchers' store, under the round's prefix
    set("TORCHELASTIC_USE_AGENT_STORE", "True");
    set("TORCHELASTIC_RUN_ID", o.rdzv_id);
  }
  // Rank 0's store serves on the launcher's loopback socket (src/comm/store_socket.h).
  if (a.store_listen_fd >= 0 && o.node_rank == 0 && local_rank == 0) {
    fcntl(a.store_listen_fd, F_SETFD, 0);  // inherited across exec by this rank only
    set("FSDPP_STORE_LISTEN_FD", std::to_string(a.store_listen_fd));
  } else {
    unsetenv("FSDPP_STORE_LISTEN_FD");
  }
  setenv("OMP_NUM_THREADS", "1", 0);  // as torchrun: N ranks must not each use every core
  // A rank's stdout is our pipe: this tells it whether a progress bar would reach a terminal.
  if (status_line_enabled())
    set("FSDPP_STDOUT_IS_TERMINAL", "1");
  else
    unsetenv("FSDPP_STDOUT_IS_TERMINAL");
  if (o.timeout_seconds > 0) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", o.timeout_seconds);
    set("FSDPP_TIMEOUT_SECONDS", text);
  }
}

// Runs in the forked child: becomes the rank's process and never returns.
[[noreturn]] void exec_rank(const Options& o, const Attempt& a, int local_rank, pid_t launcher,
                            const sigset_t& original_mask) {
  setpgid(0, 0);  // own group, so stopping the rank also stops its children
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(128 + SIGKILL);  // launcher died before prctl took hold
  signal(SIGPIPE, SIG_DFL);  // undo the launcher's own signal setup
  sigprocmask(SIG_SETMASK, &original_mask, nullptr);
  set_rank_env(o, a, local_rank);
  // The launcher's rendezvous store and its connections stay with the launcher.
  if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0)  // before Linux 5.11: the usual descriptors
    for (int fd = 3; fd < 1024; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
  if (a.store_listen_fd >= 0) fcntl(a.store_listen_fd, F_SETFD, 0);  // rank 0's to serve on

  std::vector<char*> argv;
  for (const auto& arg : o.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  int error = errno;
  dprintf(STDERR_FILENO, "fsdpp-run: cannot execute '%s': %s\n", argv[0], strerror(error));
  _exit(error == ENOENT ? 127 : 126);  // the shell's codes for "not found" / "not runnable"
}

bool spawn(Rank& r, const Options& o, const Attempt& a, int local_rank, const sigset_t& original_mask) {
  int out[2], err[2];
  if (!open_pipe(out)) return false;
  if (!open_pipe(err)) {
    close(out[0]), close(out[1]);
    return false;
  }
  pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);  // dup2 drops close-on-exec on the copies
    dup2(err[1], STDERR_FILENO);
    exec_rank(o, a, local_rank, launcher, original_mask);
  }
  close(out[1]), close(err[1]);
  if (pid < 0) {
    close(out[0]), close(err[0]);
    return false;
  }
  setpgid(pid, pid);  // the child does it too: whichever runs first wins the race
  r.rank = o.node_rank * o.nproc_per_node + local_rank;
  r.pid = pid;
  r.running = true;
  std::string prefix = "[rank" + std::to_string(r.rank) + "]: ";
  r.out = Stream{out[0], STDOUT_FILENO, prefix, "", "", status_line_enabled()};
  r.err = Stream{err[0], STDERR_FILENO, prefix, "", "", false};
  return true;
}

std::string describe_exit(const Rank& r, int status) {
  std::string who = "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ")";
  if (WIFSIGNALED(status))
    return who + " was killed by " + signal_name(WTERMSIG(status));
  return who + " exited with code " + std::to_string(WEXITSTATUS(status));
}

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", s);
  return text;
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// ---------------------------------------------------------------- supervision

using Clock = std::chrono::steady_clock;

// A rank's collective-timeout report asks the store for at most 5 s (src/comm/hang_report.cpp);
// the others get that and a second more before a timed-out rank's exit stops them.
constexpr std::chrono::seconds kReportWait{6};
// How often an elastic round asks the rendezvous whether it goes on.
constexpr std::chrono::milliseconds kMembershipPoll{500};

// Owns the ranks: relays their output, reaps them, and stops them all when
// one fails or the launcher is signalled.
class Supervisor {
 public:
  Supervisor(const Options& o, int signal_fd)
      : grace_(o.kill_grace_seconds),
        signal_grace_(o.signal_grace_seconds),
        exit_wait_(o.exit_wait_seconds),
        exit_wait_given_(o.exit_wait_given),
        signal_fd_(signal_fd) {}

  void start(const Options& o, const Attempt& a, const sigset_t& original_mask);
  AttemptEnd run();

 private:
  bool any_running() const;
  bool any_group_alive() const;
  void signal_all(int sig) const;
  void stop(int sig, int exit_code, const std::string& reason, double grace);
  void stop(int sig, int exit_code, const std::string& reason) { stop(sig, exit_code, reason, grace_); }
  bool all_preempted() const;
  void kill_now();
  int poll_timeout_ms() const;
  void wait_for_events();
  void handle_signals();
  void reap();
  void on_exit(Rank& r, int status);
  void check_laggards();
  bool reports_pending() const;
  void print_summary() const;
  void check_membership();

  std::vector<Rank> ranks_;
  std::function<std::string()> membership_changed_;
  std::function<void(const std::string&, int)> rank_failed_;
  std::function<void(const std::string&)> told_to_stop_;
  Clock::time_point next_membership_check_;
  bool membership_stop_ = false;    // the ranks were stopped for a new round
  double grace_;
  double signal_grace_;
  double exit_wait_;
  bool exit_wait_given_;
  bool laggards_named_ = false;     // the ranks at work after exit_wait_ were named
  int first_clean_exit_ = -1;       // the first rank to exit 0, if any
  int deferred_exit_code_ = 0;      // a failure whose stop waits for the others' reports
  std::string deferred_reason_;
  Clock::time_point reports_by_;    // when that wait ends
  Clock::time_point laggards_at_;   // when the others have waited exit_wait_ after it
  int signal_fd_;
  int exit_code_ = 0;
  std::string reason_;              // why the attempt ended, once it is ending
  bool stopping_ = false;           // SIGTERM (or a forwarded signal) went out
  bool killed_ = false;             // SIGKILL went out
  bool leftovers_stopped_ = false;  // SIGTERM went to what outlived the ranks
  int forwarded_signal_ = 0;        // the SIGINT/SIGTERM we passed on, if any
  Clock::time_point kill_at_;
};

void Supervisor::start(const Options& o, const Attempt& a, const sigset_t& original_mask) {
  membership_changed_ = a.membership_changed;
  rank_failed_ = a.rank_failed;
  told_to_stop_ = a.told_to_stop;
  ranks_.resize(static_cast<size_t>(o.nproc_per_node));
  for (int local = 0; local < o.nproc_per_node; ++local) {
    if (!spawn(ranks_[static_cast<size_t>(local)], o, a, local, original_mask)) {
      const std::string why = std::string("cannot start rank processes: ") + strerror(errno);
      say(why);
      ranks_.resize(static_cast<size_t>(local));
      stop(SIGTERM, 1, why);
      return;
    }
  }
}

AttemptEnd Supervisor::run() {
  for (;;) {
    if (!any_running()) {
      // Every rank exited before the failure's deferred stop: the failure still decides the code.
      if (!stopping_ && deferred_exit_code_ != 0) exit_code_ = deferred_exit_code_, reason_ = deferred_reason_;
      if (killed_ || !any_group_alive()) break;
      // The ranks are gone but left processes behind, which a forwarded
      // SIGINT may not have stopped: SIGTERM them now, SIGKILL at the deadline.
      if (!leftovers_stopped_) {
        leftovers_stopped_ = true;
        stop(SIGTERM, exit_code_, reason_);
      }
    }
    if (stopping_ && !killed_ && Clock::now() >= kill_at_) {
      kill_now();
      continue;
    }
    if (!stopping_ && deferred_exit_code_ != 0 && (Clock::now() >= reports_by_ || !reports_pending())) {
      stop(SIGTERM, deferred_exit_code_, deferred_reason_);
      continue;
    }
    if (!stopping_ && first_clean_exit_ >= 0 && any_running() && Clock::now() >= laggards_at_) {
      check_laggards();
      continue;
    }
    if (membership_changed_ && !killed_ && Clock::now() >= next_membership_check_) {
      check_membership();
      continue;
    }
    wait_for_events();
  }
  for (auto& r : ranks_) {
    drain(r.out), drain(r.err);
    close_stream(r.out), close_stream(r.err);
  }
  end_status_line();
  // Told to stop, the ranks saved their state and said so: the job is preempted, not failed.
  if (forwarded_signal_ != 0 && all_preempted()) exit_code_ = kPreemptedExitCode;
  // Preempted is a promise that every rank saved: a rank that did not makes it a failure.
  if (exit_code_ == kPreemptedExitCode && !all_preempted())
    for (const auto& r : ranks_)
      if (!r.running && !(WIFEXITED(r.status) && WEXITSTATUS(r.status) == kPreemptedExitCode)) {
        exit_code_ = exit_code_of(r.status) == 0 ? 1 : exit_code_of(r.status);
        reason_ += "; but " + describe_exit(r, r.status) + " without saving";
        break;
      }
  if (exit_code_ != 0 && forwarded_signal_ == 0 && exit_code_ != kPreemptedExitCode && !membership_stop_)
    print_summary();
  if (reason_.empty()) reason_ = "all ranks exited with code 0";
  return AttemptEnd{exit_code_, reason_, forwarded_signal_, membership_stop_};
}

// A new round stops the ranks as a scheduler does: SIGTERM and the signal grace, time to save.
void Supervisor::check_membership() {
  next_membership_check_ = Clock::now() + kMembershipPoll;
  const std::string reason = membership_changed_();  // also this node's heartbeat, so even while stopping
  // A failure of ours (stopping, or waiting for the timeout reports) ends the round itself.
  if (reason.empty() || stopping_ || deferred_exit_code_ != 0) return;
  membership_stop_ = true;
  say(reason + "; stopping the ranks (SIGTERM, SIGKILL in " + seconds(signal_grace_) + ")");
  stop(SIGTERM, 1, reason, signal_grace_);
}

bool Supervisor::all_preempted() const {
  for (const auto& r : ranks_)
    if (r.running || !WIFEXITED(r.status) || WEXITSTATUS(r.status) != kPreemptedExitCode) return false;
  return !ranks_.empty();
}

// A rank that exited 0 means the job's work is done. Those still running exit_wait_ later are
// named; a stopped one (SIGSTOP: no work happens in that state) ends the job, and so does
// any one when the user gave --exit-wait-seconds. Otherwise ranks at work (rank 0 writing
// the final export, say) are waited for, and re-checked every second for being stopped.
void Supervisor::check_laggards() {
  char wait[32];
  std::snprintf(wait, sizeof wait, "%g", exit_wait_);
  const std::string after = std::string(wait) + " s after rank " + std::to_string(first_clean_exit_) +
                            " exited with code 0";
  bool end_job = exit_wait_given_;
  for (const auto& r : ranks_)
    if (r.running && fsdpp_run::process_state(r.pid) == 'T') end_job = true;
  if (end_job || !laggards_named_) {
    for (const auto& r : ranks_) {
      if (!r.running) continue;
      const char state = fsdpp_run::process_state(r.pid);
      say("rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") is still running " + after +
          (state == 'T' || state == 't' ? " (it is stopped: SIGSTOP or a debugger)" : "") +
          (end_job ? "; stopping all ranks" : "; waiting for it (--exit-wait-seconds S stops such ranks)"));
    }
  }
  laggards_named_ = true;
  if (end_job) return stop(SIGTERM, 1, "rank(s) still running " + after);
  laggards_at_ = Clock::now() + std::chrono::seconds(1);
}

// A running rank that has not reported a collective timeout and is not stopped may still do so.
bool Supervisor::reports_pending() const {
  for (const auto& r : ranks_) {
    if (!r.running || !r.err.timeout_report.empty() || !r.out.timeout_report.empty()) continue;
    const char state = fsdpp_run::process_state(r.pid);
    if (state != 'T' && state != 't' && state != 'Z') return true;
  }
  return false;
}

void Supervisor::print_summary() const {
  std::vector<fsdpp_run::RankFate> fates;
  for (const auto& r : ranks_) {
    fsdpp_run::RankFate f;
    f.rank = r.rank;
    f.pid = r.pid;
    f.reaped = !r.running;
    f.status = r.status;
    f.stopped_by_us = r.stopped_by_us;
    f.state_at_stop = r.state_at_stop;
    f.timeout_report = r.err.timeout_report.empty() ? r.out.timeout_report : r.err.timeout_report;
    fates.push_back(f);
  }
  for (const auto& line : fsdpp_run::summarize(fates)) say("summary: " + line);
}

bool Supervisor::any_running() const {
  for (const auto& r : ranks_)
    if (r.running) return true;
  return false;
}

// A group outlives its leader while any grandchild in it is alive.
bool Supervisor::any_group_alive() const {
  for (const auto& r : ranks_)
    if (kill(-r.pid, 0) == 0 || errno == EPERM) return true;
  return false;
}

void Supervisor::signal_all(int sig) const {
  for (const auto& r : ranks_) kill(-r.pid, sig);
}

// Starts the shutdown: the first reason to stop sets the exit code and the
// SIGKILL deadline.
// `sig` 0 sends nothing: the ranks are ending by themselves, and SIGKILL follows at the deadline.
void Supervisor::stop(int sig, int exit_code, const std::string& reason, double grace) {
  if (!stopping_) {
    stopping_ = true;
    exit_code_ = exit_code;
    reason_ = reason;
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(grace));
    for (auto& r : ranks_) {  // for the summary: who was still at it, and in what state
      const char state = r.running ? fsdpp_run::process_state(r.pid) : 'Z';
      if (state == 'Z') continue;  // exited, not yet reaped: its exit status will tell
      r.stopped_by_us = true;
      r.state_at_stop = state;
    }
  }
  if (sig == 0) return;
  signal_all(sig);
  signal_all(SIGCONT);  // a stopped rank would hold the signal pending until SIGKILL
}

void Supervisor::kill_now() {
  if (any_running() || any_group_alive())
    say("processes still alive after the grace period; sending SIGKILL");
  signal_all(SIGKILL);
  killed_ = true;
}

int Supervisor::poll_timeout_ms() const {
  int timeout = -1;
  auto until = [](Clock::time_point t) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
    return static_cast<int>(std::max<long long>(0, std::min<long long>(left, 60000)));
  };
  if (stopping_ && !killed_) timeout = until(kill_at_);
  if (!stopping_ && first_clean_exit_ >= 0) timeout = until(laggards_at_);
  if (!stopping_ && deferred_exit_code_ != 0) {
    const int reports = std::min(until(reports_by_), 200);  // also re-check who is stopped
    timeout = timeout < 0 ? reports : std::min(timeout, reports);
  }
  // Grandchildren are not our children (unless orphaned), so their deaths
  // wake nobody: poll for their groups to empty.
  if (!any_running()) timeout = timeout < 0 ? 100 : std::min(timeout, 100);
  if (membership_changed_ && !killed_) {
    const int check = until(next_membership_check_);
    timeout = timeout < 0 ? check : std::min(timeout, check);
  }
  return timeout;
}

void Supervisor::wait_for_events() {
  std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
  std::vector<Stream*> streams;
  for (auto& r : ranks_)
    for (Stream* s : {&r.out, &r.err})
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
      }
  if (poll(fds.data(), fds.size(), poll_timeout_ms()) <= 0) return;
  // Output first, so what a rank printed before dying appears before its death.
  for (size_t i = 0; i < streams.size(); ++i)
    if (fds[i + 1].revents != 0) read_once(*streams[i]);
  if (fds[0].revents != 0) handle_signals();
}

void Supervisor::handle_signals() {
  signalfd_siginfo info;
  while (read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) {
      reap();
    } else if (forwarded_signal_ != 0) {  // the user insists
      say("received " + signal_name(sig) + " while stopping; sending SIGKILL");
      signal_all(SIGKILL);
      killed_ = true;
    } else {
      const double left = stopping_ ? std::chrono::duration<double>(kill_at_ - Clock::now()).count() : signal_grace_;
      say("received " + signal_name(sig) + "; forwarding it to all ranks (SIGKILL in " + seconds(std::max(0.0, left)) +
          ")");
      forwarded_signal_ = sig;
      if (told_to_stop_) told_to_stop_("fsdpp-run received " + signal_name(sig));
      stop(sig, 128 + sig, "fsdpp-run received " + signal_name(sig), signal_grace_);
    }
  }
}

// We are a child subreaper, so orphaned grandchildren land here too: reap
// everything, and act on the ranks.
void Supervisor::reap() {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
    for (auto& r : ranks_)
      if (r.pid == pid && r.running) on_exit(r, status);
}

void Supervisor::on_exit(Rank& r, int status) {
  r.running = false;
  r.status = status;
  drain(r.out), drain(r.err);  // what it wrote before dying comes first
  flush_partial_line(r.out), flush_partial_line(r.err);
  bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (!failed && first_clean_exit_ < 0) {
    first_clean_exit_ = r.rank;
    laggards_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(exit_wait_));
  }
  if (!failed || stopping_ || deferred_exit_code_ != 0) return;  // deaths we caused are not news
  const bool preempted = WIFEXITED(status) && WEXITSTATUS(status) == kPreemptedExitCode;
  // Other nodes learn it from us. A preempted rank is not a failure: every node saves on its own.
  if (rank_failed_ && !preempted) rank_failed_(describe_exit(r, status), exit_code_of(status));
  if (!r.err.timeout_report.empty() || !r.out.timeout_report.empty()) {
    // The others are most likely in the same wait and report within their grace period:
    // stopping them now would cut their reports off.
    say(describe_exit(r, status) + " after a collective timeout; stopping all ranks once they have reported "
        "(" + std::to_string(kReportWait.count()) + " s at most)");
    deferred_exit_code_ = exit_code_of(status);
    deferred_reason_ = describe_exit(r, status) + " after a collective timeout";
    reports_by_ = Clock::now() + kReportWait;
    return;
  }
  if (preempted) {
    // Preempted on a signal of its own (srun signals every task): the others got it too and are
    // saving; a SIGTERM now could reach one past its handler and end it before it exits 75.
    say(describe_exit(r, status) + " (preempted: it saved its state); the other ranks get " + seconds(signal_grace_) +
        " to do the same");
    return stop(0, kPreemptedExitCode, describe_exit(r, status) + " (preempted)", signal_grace_);
  }
  say(describe_exit(r, status) + "; stopping all ranks");
  stop(SIGTERM, exit_code_of(status), describe_exit(r, status));
}

// The signals the launcher reads from its signal descriptor.
sigset_t supervised_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM}) sigaddset(&set, sig);
  return set;
}

// The mask fsdpp-run was started with, when block_signals_before_libraries re-executed it.
std::optional<sigset_t> mask_before_reexec;

// If we were started with fd 0, 1 or 2 closed, a pipe would take its number
// and ranks' output would loop back into it: fill the gaps with /dev/null.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd)
    if (fcntl(fd, F_GETFD) < 0) open("/dev/null", O_RDWR);
}

// Blocks the signals we handle and returns a descriptor that reports them,
// so the event loop sees signals and output in one poll().
int watch_signals(sigset_t& original_mask) {
  signal(SIGPIPE, SIG_IGN);   // a closed stdout must not kill the supervisor
  signal(SIGCHLD, SIG_DFL);   // an inherited SIG_IGN would auto-reap the ranks
  const sigset_t set = supervised_signals();
  sigprocmask(SIG_BLOCK, &set, &original_mask);
  if (mask_before_reexec) original_mask = *mask_before_reexec;
  return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

}  // namespace

void block_signals_before_libraries(char** argv) {
  constexpr const char* kVariable = "FSDPP_RUN_ORIGINAL_SIGMASK";
  if (const char* saved = std::getenv(kVariable)) {  // the re-executed launcher
    sigset_t original;
    sigemptyset(&original);
    const unsigned long long bits = std::strtoull(saved, nullptr, 16);
    for (int sig = 1; sig <= 64; ++sig)
      if (bits >> (sig - 1) & 1) sigaddset(&original, sig);
    mask_before_reexec = original;
    unsetenv(kVariable);
    return;
  }
  const sigset_t set = supervised_signals();
  sigset_t original;
  sigprocmask(SIG_BLOCK, &set, &original);
  unsigned long long bits = 0;
  for (int sig = 1; sig <= 64; ++sig)
    if (sigismember(&original, sig) == 1) bits |= 1ULL << (sig - 1);
  char text[32];
  std::snprintf(text, sizeof text, "%llx", bits);
  setenv(kVariable, text, 1);
  execv("/proc/self/exe", argv);
  unsetenv(kVariable);  // cannot: go on, with the libraries' threads as they are
  sigprocmask(SIG_SETMASK, &original, nullptr);
}

int start_supervising(sigset_t& original_mask) {
  ensure_standard_fds();
  int signal_fd = watch_signals(original_mask);
  if (signal_fd < 0) {
    say(std::string("signalfd: ") + strerror(errno));
    return -1;
  }
  prctl(PR_SET_CHILD_SUBREAPER, 1);  // orphaned grandchildren come to us to be reaped
  if (isatty(STDOUT_FILENO)) enable_status_line();
  return signal_fd;
}

AttemptEnd run_attempt(const Options& options, const Attempt& attempt, int signal_fd, const sigset_t& original_mask) {
  Supervisor supervisor(options, signal_fd);
  supervisor.start(options, attempt, original_mask);
  return supervisor.run();
}

}  // namespace fsdpp_run
