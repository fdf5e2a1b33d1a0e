#pragma once
// How a collective of device tensors meets the streams, as FSDP2's: the issuing thread's current
// stream is marked when the collective is issued, and the collective runs on one of its group's
// high-priority streams (all-gathers, reduce-scatters, or all-reduces and the rest, so a prefetch
// and a reduce-scatter overlap) after that mark, so it reads what was computed before the call
// and nothing later. Its Work completes when it is queued there; Work::wait() makes the waiting
// thread's current stream wait for its end (comm/device_completion.h), as c10d's NCCL Work does.
// Under NCCL (and its contract double, comm/nccl_contract_backend.h) the collective is launched
// from the issuing thread, in program order, as PyTorch does: NCCL's launch is asynchronous, and
// kernels of several communicators launched in different orders on different ranks can wait on
// each other forever. Over Gloo (which stages CUDA tensors through host memory and blocks) it runs
// on the group's comm thread. Under TORCH_NCCL_BLOCKING_WAIT=1 the host waits for its end, up to
// the group's timeout. Private to fsdpp.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/collective_intent.h"
#include "comm/device_completion.h"

namespace fsdpp::detail {

struct ProcessGroupImpl;

// Whether `t`'s collectives over `g` take the device path: an accelerator tensor, or a CPU one
// over the NCCL-contract double.
bool takes_device_path(const ProcessGroupImpl& g, const at::Tensor& t);

// A testing knob, as PyTorch's overlap tests delay their collectives: from now on each
// collective on the device path first queues `delay` on its stream (at::cuda::sleep on a GPU, a
// sleep on a CPU comm stream), so that it ends that long after it could have and a consumer that
// does not wait for it reads stale data. Zero (the default) queues nothing. Process-wide.
void set_device_collective_delay(std::chrono::microseconds delay);

class DeviceHandoff {
 public:
  DeviceHandoff() = default;  // a host collective: nothing to hand off
  // On the issuing thread: for a collective of `g` over `tensors` that takes the device path,
  // marks the issuing stream, takes `stream` (the caller's: FSDP's comm context), else `g`'s
  // stream for `kind`, and holds the tensors; a host collective otherwise.
  static DeviceHandoff at_issue(const ProcessGroupImpl& g, CollectiveKind kind, std::vector<at::Tensor> tensors,
                                CommStream* stream = nullptr);

  bool on_device() const { return completion_ != nullptr; }
  // Launched from the issuing thread (NCCL's contract) rather than from the comm thread.
  bool launches_on_issue() const { return launches_on_issue_; }
  // Runs `launch` with the collective's stream current, after the issue mark (a host collective:
  // plainly). `launch` calls queued() once the collective is queued; if it throws before, the
  // end is recorded anyway (what it queued may still run, and the held tensors wait for it). A
  // Work waited for inside `launch` (a chained collective's) orders the stream after it.
  void run(const std::function<void()>& launch) const;
  // Records the end on the collective's stream. Under blocking wait the host then waits for it,
  // up to the group's timeout, and throws a timeout that the submission turns into the hang
  // report.
  void queued() const;
  // What Work::wait() completes on the waiting thread; null for a host collective.
  const std::shared_ptr<DeviceCompletion>& completion() const { return completion_; }

 private:
  std::optional<c10::Stream> stream_;
  std::shared_ptr<StreamEvent> issued_;
  std::shared_ptr<DeviceCompletion> completion_;
  std::shared_ptr<bool> recorded_;
  bool launches_on_issue_ = false;
  bool blocking_wait_ = false;
  std::chrono::milliseconds timeout_{0};
};

}  // namespace fsdpp::detail
