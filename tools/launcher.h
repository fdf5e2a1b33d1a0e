#pragma once
// fsdpp-run's pieces: its options, its own messages, and the job it starts and supervises.
#include <string>
#include <vector>

namespace fsdpp_run {

struct Options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double kill_grace_seconds = 3.0;
  double timeout_seconds = 0;        // 0: not given; the program's own timeout applies
  double exit_wait_seconds = 300;    // after a clean exit, how long the others may take
  bool exit_wait_given = false;      // given: every rank still running then is stopped, not only stopped ones
  std::vector<std::string> command;  // program and its arguments
};


// The launcher's own messages, one line each on stderr.
void say(const std::string& message);

// Starts the ranks, relays their output and supervises them until the job ends; returns
// fsdpp-run's exit code.
int run_job(const Options& options);

}  // namespace fsdpp_run
