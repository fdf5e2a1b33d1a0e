#include "comm/comm_thread.h"

#include <c10/util/Exception.h>

#include <fsdpp/error.h>
#include <fsdpp/profiler.h>
#include <fsdpp/work.h>

#include "comm/device_completion.h"
#include "comm/error_message.h"
#include "profiler/timeline.h"

namespace fsdpp::detail {

void WorkState::finish(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    error = std::move(e);
    done = true;
  }
  done_cv.notify_all();
}

void WorkState::wait() {
  std::unique_lock<std::mutex> lock(mutex);
  done_cv.wait(lock, [&] { return done; });
  if (error) std::rethrow_exception(error);
}

bool WorkState::is_completed() {
  std::lock_guard<std::mutex> lock(mutex);
  return done;
}

std::exception_ptr run_collective(const std::string& description, const std::function<void()>& run) {
  try {
    run();
  } catch (const Error&) {
    return std::current_exception();
  } catch (const c10::OutOfMemoryError& e) {
    // Kept an out-of-memory error, as a GPU's would be, so callers can tell it apart.
    return std::make_exception_ptr(
        c10::OutOfMemoryError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                              description + " failed: " + e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(Error(description + " failed: " + message_without_backtrace(e)));
  }
  return nullptr;
}

CommThread::CommThread() : thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<WorkState> CommThread::enqueue(std::string description, std::function<void()> run) {
  auto state = std::make_shared<WorkState>();
  state->description = std::move(description);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({state, std::move(run)});
  }
  cv_.notify_one();
  return state;
}

void CommThread::loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error = run_collective(task.state->description, task.run);
    // Drop the collective's tensors before reporting completion: a caller that frees its
    // buffers after wait() must find them unreferenced.
    task.run = nullptr;
    task.state->finish(error);
  }
}

}  // namespace fsdpp::detail

namespace fsdpp {

void Work::wait() const {
  if (!state_) return;
  profiler::record_function span(profiler::detail::recording() ? "wait " + state_->trace_name : std::string());
  state_->wait();
  if (state_->device) state_->device->wait_on_current_stream();
}

// A device collective is complete once the device ran it, as c10d's NCCL Work's isCompleted():
// FSDP finalizes reduce-scatters that are, during backward, without making compute wait.
bool Work::is_completed() const {
  return !state_ || (state_->is_completed() && (!state_->device || state_->device->query()));
}

}  // namespace fsdpp
