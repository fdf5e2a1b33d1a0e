#pragma once
// A timeline of this process's training step, in the Chrome trace event format that
// Perfetto (https://ui.perfetto.dev) and chrome://tracing open, as PyTorch's
// `torch.profiler.profile(...).export_chrome_trace(path)` writes.
//
// While recording, every collective of every group is recorded: when it was issued (on the
// issuing thread, with the innermost record_function open there), when the group's comm
// thread ran it (start to finish, on that thread's track) and when a caller waited on its
// Work. FSDP marks each unit's all-gather, wait, post-backward reduce-scatter and the end
// of backward; users mark their own phases (forward, backward, optimizer) with
// record_function. Not recording, each costs an atomic load.
#include <string>

#include <torch/arg.h>

namespace fsdpp::profiler {

// libtorch's TORCH_ARG style: `name(v)` sets and returns *this, `name()` reads.
struct ProfilerOptions {
  // PyTorch's profile_memory: a counter track `memory` of the bytes of tensor storage alive
  // (fsdpp::memory_stats().current_bytes), sampled at every allocation and free, so the
  // step's peak and what was running then can be read off the timeline.
  TORCH_ARG(bool, profile_memory) = false;
};

// Clears what an earlier recording left and starts recording.
void start(const ProfilerOptions& options = {});
// Stops recording; what was recorded stays until the next start().
void stop();
bool is_recording();

// Writes what was recorded so far to `path` as JSON (one process: pid = the global rank when
// a default group is initialized, else the OS pid; one track per thread). Times are
// microseconds of the wall clock, so ranks' files line up when merged
// (scripts/merge-chrome-traces.py). Throws fsdpp::Error naming the file if it cannot be written.
void export_chrome_trace(const std::string& path);

// Marks a span of the calling thread from construction to destruction (PyTorch's
// `torch.profiler.record_function`). Spans nest. Recorded only if recording when it began.
class record_function {
 public:
  explicit record_function(std::string name);
  ~record_function();
  record_function(const record_function&) = delete;
  record_function& operator=(const record_function&) = delete;

 private:
  std::string name_;
  long long start_us_ = -1;  // -1: not recording when it began
};

}  // namespace fsdpp::profiler
