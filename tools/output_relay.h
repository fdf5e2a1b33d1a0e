#pragma once
// fsdpp-run's relaying of rank output: each rank's stdout and stderr read from a pipe and written
// line by line with a "[rank<R>]: " prefix, so lines of different ranks never interleave. On a
// terminal, what a rank redraws in place with carriage returns (a progress bar) is shown as one
// status line under the log instead of piling up in it.
#include <string>

namespace fsdpp_run {

// One pipe from a rank's stdout or stderr.
struct Stream {
  int fd = -1;         // our read end; -1 once closed
  int out_fd = -1;     // where the lines go: our stdout or stderr
  std::string prefix;  // "[rank<R>]: "
  std::string pending; // bytes after the last newline
  std::string timeout_report;  // the last fsdpp collective-timeout line, for the summary
  bool redraws = false;  // carriage returns redraw the status line (our stdout on a terminal)
};

// Reads one chunk; returns false when nothing more is available right now.
bool read_once(Stream& s);
// Reads what a rank left in the pipe, boundedly so a chatty grandchild cannot stall the launcher.
void drain(Stream& s);
// A line without its newline still deserves its prefix, once no more of it is coming.
void flush_partial_line(Stream& s);
void close_stream(Stream& s);

// The status line: drawn only once enabled (our stdout is a terminal); end() erases it for good.
void enable_status_line();
bool status_line_enabled();
void end_status_line();

}  // namespace fsdpp_run
