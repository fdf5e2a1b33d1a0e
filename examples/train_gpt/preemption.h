#pragma once
// Preemption and restarts. A scheduler (or fsdpp-run, forwarding its own SIGTERM to every rank)
// asks a job to end with SIGTERM and kills it a grace period later; SLURM's --signal=USR1@120 and
// the like warn with another signal first. The trainer catches SIGTERM and the signal
// --exit-signal names; the handler only records the signal. After each step the ranks agree
// (one 1-element all_reduce) whether any of them got one; if so they all save the step reached
// and exit with kExitPreempted, which a launcher or job script takes as "resume me".
#include <csignal>
#include <string>
#include <utility>
#include <vector>

namespace train_gpt {

// EX_TEMPFAIL of <sysexits.h>: preempted, the step reached is saved; run again with --resume.
constexpr int kExitPreempted = 75;

// The signal `name` names: SIGUSR1, USR1 or usr1 (one that can be caught and that a scheduler
// or a user sends to ask for an end: HUP, INT, QUIT, TERM, USR1, USR2, XCPU, ALRM). Throws
// std::invalid_argument naming --exit-signal otherwise.
int signal_number(const std::string& name);
// "SIGUSR1" for SIGUSR1.
std::string signal_name(int signal);

// While alive, SIGTERM and `exit_signal` only set a flag (the previous handlers come back at
// destruction). One per process.
class StopRequest {
 public:
  explicit StopRequest(int exit_signal);
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  // Collective over the default group (every rank calls it after the same step): the signal some
  // rank received (the largest number if they differ), 0 when none did.
  int agreed() const;

 private:
  std::vector<std::pair<int, struct sigaction>> previous_;
};

// Which attempt this is under a launcher that restarts failed jobs (fsdpp-run --max-restarts,
// torchrun --max-restarts): FSDPP_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT; 0 when neither
// is set (a first attempt).
int restart_count();

}  // namespace train_gpt
