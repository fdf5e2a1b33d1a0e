#pragma once
// What fsdpp's own code records into the profiler's timeline (include/fsdpp/profiler.h).
// The profiler is a low layer: comm and memory record into it and tell it what it labels a
// trace with (the rank, the bytes alive at start()); it includes neither. Private to fsdpp.
#include <atomic>
#include <string>
#include <utility>
#include <vector>

namespace fsdpp::profiler::detail {

extern std::atomic<bool> g_recording;
inline bool recording() { return g_recording.load(std::memory_order_relaxed); }
extern std::atomic<bool> g_recording_memory;
inline bool recording_memory() { return g_recording_memory.load(std::memory_order_relaxed); }

// "what who" while recording, "" otherwise: a record_function name not built when not needed.
inline std::string span_name(const char* what, const std::string& who) {
  return recording() ? std::string(what) + " " + who : std::string();
}

// Microseconds of the wall clock (ranks' timelines line up when merged).
long long now_us();

// The innermost record_function open on the calling thread, "" if none.
std::string current_span();

// Names the calling thread's track, e.g. "comm thread of group world".
void name_this_thread(const std::string& name);

struct Event {
  std::string name;
  std::string category;
  long long start_us = 0;
  long long duration_us = -1;  // -1: an instant
  std::vector<std::pair<std::string, std::string>> args;
};

// Adds `event` on the calling thread's track, if recording.
void record(Event event);

// A sample of the `memory` counter: `bytes` of tensor storage alive now. Called by the CPU
// allocator on every allocation and free while recording memory.
void record_memory(long long bytes);

// This process's global rank, -1 for none: export_chrome_trace labels the trace "rank R" (pid R)
// while it is set, else "pid P". init_process_group sets it, destroy_process_group clears it.
void set_process_rank(int rank);

// What start() samples first when recording memory: the bytes of tensor storage alive now.
// fsdpp's CPU allocator registers it when libfsdpp loads; until then the first sample is skipped.
void set_memory_source(long long (*current_bytes)());

}  // namespace fsdpp::profiler::detail
