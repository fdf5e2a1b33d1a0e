#pragma once
// The handle an asynchronous collective returns (c10d's Work, PyTorch's `async_op=True`).
#include <chrono>
#include <memory>

namespace fsdpp {

namespace detail {
struct WorkState;
}

class Work {
 public:
  // A default Work is already complete.
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

  // Blocks until the collective finished; throws fsdpp::Error if it failed or
  // timed out (the message names the collective, the group and the rank). On CUDA tensors it
  // blocks until the collective is queued on its stream, and makes this thread's current
  // stream wait for its end (c10d's NCCL Work; docs/api.md, "CUDA tensors").
  void wait() const;
  // Finished (on CUDA tensors: run by the device); never blocks.
  bool is_completed() const;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace fsdpp
