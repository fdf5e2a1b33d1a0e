#pragma once
// fsdpp-run's pieces: its options, its own messages, one attempt at running the ranks
// (rank_supervisor.cpp), and the job: attempts and restarts (job_restarts.cpp).
#include <signal.h>

#include <functional>
#include <string>
#include <vector>

namespace fsdpp_run {

struct Options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool master_port_given = false;    // else a single-node job serves its store on a free loopback port
  bool nnodes_given = false, node_rank_given = false, master_addr_given = false;  // else Slurm's, if any
  int max_restarts = 0;              // restarts of all ranks after a failure, per job (torchrun's flag)
  double signal_grace_seconds = 30;  // after a forwarded SIGINT/SIGTERM, before SIGKILL (torchrun's 30 s)
  double kill_grace_seconds = 3.0;
  double timeout_seconds = 0;        // 0: not given; the program's own timeout applies
  double exit_wait_seconds = 300;    // after a clean exit, how long the others may take
  bool exit_wait_given = false;      // given: every rank still running then is stopped, not only stopped ones
  std::vector<std::string> command;  // program and its arguments

  // The elastic rendezvous (torchrun's c10d backend), on when --rdzv-endpoint is given.
  int min_nodes = 1, max_nodes = 1;  // --nnodes MIN:MAX (N means N:N)
  std::string rdzv_endpoint;         // HOST:PORT of the rendezvous store
  std::string rdzv_host;
  int rdzv_port = 0;
  std::string rdzv_id = "none";
  double join_timeout = 600;         // --rdzv-conf, torchrun's keys and defaults
  double last_call_timeout = 30;     // once MIN nodes are in, how long others may still join
  double keep_alive_interval = 5;    // a node that has not beaten for interval x max_attempt is lost
  int keep_alive_max_attempt = 3;
  bool elastic() const { return !rdzv_endpoint.empty(); }
};

// Exit codes that mean something to the launcher.
// A usage error (a bad flag, a missing file: argparse's and the shell's code) is not restarted:
// retrying cannot help (pytorch#60910); neither is a program that cannot be executed.
inline constexpr int kUsageErrorExitCode = 2;
inline constexpr int kCannotExecuteExitCode = 126, kNotFoundExitCode = 127;
// EX_TEMPFAIL (sysexits.h): the rank saved its state on a signal and stopped; resume it later.
inline constexpr int kPreemptedExitCode = 75;

// One start of all of this node's ranks.
struct Attempt {
  int number = 0;            // TORCHELASTIC_RESTART_COUNT: 0, then 1 for the first restart...
  int master_port = 0;       // MASTER_PORT for this attempt
  int store_listen_fd = -1;  // a listening loopback socket rank 0's store serves on, or -1
  // An elastic round: the launchers' store serves the ranks too (TORCHELASTIC_USE_AGENT_STORE),
  // and the round ends early when this returns a reason (a node lost, one waiting to join).
  bool agent_store = false;
  std::function<std::string()> membership_changed;
  // Called at the attempt's first failure, with what happened and the exit code it implies.
  std::function<void(const std::string& what, int exit_code)> rank_failed;
  std::function<void(const std::string& what)> told_to_stop;  // a SIGINT/SIGTERM forwarded to the ranks
};

// How an attempt ended: the launcher's exit code if it is the last, and why, in a few words.
struct AttemptEnd {
  int exit_code = 0;
  std::string reason;        // "rank 1 (pid 123) was killed by SIGKILL", "all ranks exited with code 0"
  int forwarded_signal = 0;  // a SIGINT/SIGTERM the launcher received and passed on: the job ends
  bool membership_changed = false;  // stopped because Attempt::membership_changed said so
};

// Inside an srun step of a Slurm job, sets the nodes, this node's rank and the store's address
// (the first host; the port from the job id) from SLURM_* unless --nnodes, --node-rank or
// --master-addr was given. Returns a line saying so ("" outside Slurm); throws
// std::invalid_argument naming the variable or the misuse (several tasks per node).
std::string adopt_slurm_allocation(Options& options);

// The launcher's own messages, one line each on stderr.
void say(const std::string& message);

// First thing in main: libtorch (for the elastic rendezvous's store) may start threads before
// main, which would take the signals the launcher reads from its signal descriptor (Debian's
// 2.6 does: a SIGTERM then killed fsdpp-run, and a SIGCHLD could be lost). So the launcher
// blocks them and re-executes itself: every thread then starts with them blocked. Ranks get the
// original mask back.
void block_signals_before_libraries(char** argv);

// Prepares the launcher to supervise ranks: signals arrive on the returned descriptor (-1 on
// failure, said) with `original_mask` the mask ranks get back; orphans come to be reaped.
int start_supervising(sigset_t& original_mask);

// Starts the ranks, relays their output and supervises them until they have all ended.
AttemptEnd run_attempt(const Options& options, const Attempt& attempt, int signal_fd,
                       const sigset_t& original_mask);

// Runs attempts until one succeeds, cannot be helped by a restart, or --max-restarts are spent;
// returns fsdpp-run's exit code.
int run_job(const Options& options);

// The same for one node of an elastic job: each attempt is a rendezvous round (elastic_job.cpp).
int run_elastic_job(const Options& options);

// Why an attempt that ended so is not restarted after `restarts` restarts, or "" when it is.
std::string why_not_restarted(const AttemptEnd& end, int restarts, const Options& options);

// A SIGINT or SIGTERM that came while no ranks ran (0 if none); reaps leftovers on the way.
int pending_stop_signal(int signal_fd);

// "SIGTERM".
std::string signal_name(int sig);

// A socket listening on `address` (a name or a numeric address) at `port` (0: one the kernel
// picks), close-on-exec; sets `bound_port`. -1 with errno set if it cannot.
int listen_on(const std::string& address, int port, int& bound_port);

}  // namespace fsdpp_run
