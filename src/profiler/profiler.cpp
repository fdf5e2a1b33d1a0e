#include <fsdpp/profiler.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include <fsdpp/error.h>

#include "profiler/timeline.h"

namespace fsdpp::profiler {
namespace detail {

std::atomic<bool> g_recording{false};
std::atomic<bool> g_recording_memory{false};

namespace {

struct RecordedEvent {
  Event event;
  int track;
};

struct MemorySample {
  long long time_us;
  long long bytes;
};

// Never destroyed, as g_memory below.
std::mutex& g_mutex = *new std::mutex;
std::vector<RecordedEvent> g_events;
// Never destroyed: tensors freed during static destruction still report to it while recording.
std::vector<MemorySample>& g_memory = *new std::vector<MemorySample>;
std::map<int, std::string> g_track_names;
std::atomic<int> g_process_rank{-1};
std::atomic<long long (*)()> g_memory_source{nullptr};
int g_next_track = 0;

// Small numbers for threads, in the order they first record: stable across a trace's tracks.
int this_track() {
  thread_local int track = -1;
  if (track < 0) {
    std::lock_guard<std::mutex> lock(g_mutex);
    track = g_next_track++;
  }
  return track;
}

thread_local std::vector<const std::string*> t_open_spans;

}  // namespace

long long now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string current_span() { return t_open_spans.empty() ? std::string() : *t_open_spans.back(); }

void name_this_thread(const std::string& name) {
  const int track = this_track();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_track_names[track] = name;
}

void record(Event event) {
  if (!recording()) return;
  const int track = this_track();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.push_back({std::move(event), track});
}

void record_memory(long long bytes) {
  if (!recording_memory()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_memory.push_back({now_us(), bytes});
}

void set_process_rank(int rank) { g_process_rank = rank; }

void set_memory_source(long long (*current_bytes)()) { g_memory_source = current_bytes; }

}  // namespace detail

void start(const ProfilerOptions& options) {
  {
    std::lock_guard<std::mutex> lock(detail::g_mutex);
    detail::g_events.clear();
    detail::g_memory.clear();
  }
  detail::g_recording = true;
  detail::g_recording_memory = options.profile_memory();
  // The counter starts from what is alive already.
  if (options.profile_memory())
    if (auto current_bytes = detail::g_memory_source.load()) detail::record_memory(current_bytes());
}

void stop() {
  detail::g_recording_memory = false;
  detail::g_recording = false;
}

bool is_recording() { return detail::recording(); }

void export_chrome_trace(const std::string& path) {
  const int rank = detail::g_process_rank.load();
  const int pid = rank >= 0 ? rank : static_cast<int>(getpid());
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid},
                    {"args", {{"name", rank >= 0 ? "rank " + std::to_string(pid) : "pid " + std::to_string(pid)}}}});
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  {
    std::lock_guard<std::mutex> lock(detail::g_mutex);
    for (const auto& [track, name] : detail::g_track_names)
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", track}, {"args", {{"name", name}}}});
    for (const auto& [e, track] : detail::g_events) {
      nlohmann::json args = nlohmann::json::object();
      for (const auto& [key, value] : e.args) args[key] = value;
      nlohmann::json out = {{"name", e.name}, {"cat", e.category}, {"ts", e.start_us}, {"pid", pid}, {"tid", track},
                            {"args", std::move(args)}};
      if (e.duration_us >= 0) {
        out["ph"] = "X";
        out["dur"] = e.duration_us;
      } else {
        out["ph"] = "i";
        out["s"] = "t";
      }
      events.push_back(std::move(out));
    }
    // A counter track (ph "C"): Perfetto draws it as a graph of the process's memory. Threads
    // take their sample's value before the lock, so order them by time.
    std::stable_sort(detail::g_memory.begin(), detail::g_memory.end(),
                     [](const auto& a, const auto& b) { return a.time_us < b.time_us; });
    for (const auto& m : detail::g_memory)
      events.push_back({{"name", "memory"}, {"ph", "C"}, {"ts", m.time_us}, {"pid", pid},
                        {"args", {{"allocated MiB", static_cast<double>(m.bytes) / (1 << 20)}, {"bytes", m.bytes}}}});
  }
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (file) file << nlohmann::json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump() << '\n';
  if (!file) throw Error("profiler::export_chrome_trace: cannot write '" + path + "'");
}

record_function::record_function(std::string name) : name_(std::move(name)) {
  if (!detail::recording()) return;
  start_us_ = detail::now_us();
  detail::t_open_spans.push_back(&name_);
}

record_function::~record_function() {
  if (start_us_ < 0) return;
  detail::t_open_spans.pop_back();
  detail::record({std::move(name_), "phase", start_us_, detail::now_us() - start_us_, {}});
}

}  // namespace fsdpp::profiler
