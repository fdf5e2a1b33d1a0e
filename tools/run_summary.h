#pragma once
// fsdpp-run's account of a job that did not end well: what became of each rank, and whom
// the ranks whose collectives timed out name as missing. A user reads these lines first.
#include <sys/types.h>

#include <string>
#include <vector>

namespace fsdpp_run {

// The line fsdpp prints on a rank whose collective timed out (src/comm/hang_report.h).
inline constexpr const char* kTimeoutMarker = "fsdpp: collective timeout: ";

struct RankFate {
  int rank = 0;
  pid_t pid = -1;
  bool reaped = false;
  int status = 0;                // waitpid status, once reaped
  bool stopped_by_us = false;    // it was still running when fsdpp-run stopped the job
  char state_at_stop = '?';      // its /proc state then: 'T' = stopped by a signal (SIGSTOP)
  std::string timeout_report;    // its kTimeoutMarker line, if it printed one
};

// One letter from /proc/<pid>/stat ('R', 'S', 'T', 'Z', ...), '?' if it cannot be read.
char process_state(pid_t pid);

// "rank 2 (pid 123) was stopped (SIGSTOP) when the job was ended", one line per rank, then
// "ranks [0, 1, 3] timed out in a collective naming rank(s) [2] as not arrived".
std::vector<std::string> summarize(const std::vector<RankFate>& ranks);

}  // namespace fsdpp_run
