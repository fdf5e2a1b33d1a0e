#pragma once
// One background thread per process group that runs its collectives one after another.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace fsdpp::detail {

class DeviceCompletion;

// Completion state shared between a Work handle and the comm thread.
struct WorkState {
  std::string description;  // names the collective, group and rank for error messages
  std::string trace_name;   // "all_reduce #3 world", for the profiler's wait spans
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;
  // A device collective's end, which Work::wait() orders the waiting stream after once `done`
  // (comm/device_completion.h); null for a host collective.
  std::shared_ptr<DeviceCompletion> device;

  void finish(std::exception_ptr e);
  void wait();
  bool is_completed();
};

// Runs `run`, the collective `description` names (on its comm thread, or on the issuing thread
// for one launched there), and returns its failure as its Work rethrows it: an fsdpp::Error as
// it is, an out-of-memory error kept as one, anything else an fsdpp::Error naming the collective.
std::exception_ptr run_collective(const std::string& description, const std::function<void()>& run);

class CommThread {
 public:
  CommThread();
  ~CommThread();  // runs what is queued, then joins
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  std::shared_ptr<WorkState> enqueue(std::string description, std::function<void()> run);

 private:
  struct Task {
    std::shared_ptr<WorkState> state;
    std::function<void()> run;
  };
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace fsdpp::detail
