#pragma once
// Collectives on accelerator (CUDA) tensors. They run on the group's comm thread like every other
// collective, so a group keeps one order whatever the device, but through the c10d backend the
// group holds for devices (ProcessGroupNCCL, or ProcessGroupGloo, which stages CUDA tensors
// through pinned host memory) instead of fsdpp's own transports, which move host bytes.
// Streams: the issuing thread's current stream is marked when the collective is submitted
// (DeviceHandoff::at_issue); on the comm thread the backend runs under a stream of the group's
// that waits on that mark, so it reads what was computed before the call and nothing later; the
// collective ends when its result is complete, so Work::wait() means on a device what it means
// on the CPU. Private to fsdpp.
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <fsdpp/collectives.h>

#include "comm/gather_layout.h"

namespace fsdpp::detail {

struct ProcessGroupImpl;

// Whether a tensor's collectives take the device path below.
inline bool on_device(const at::Tensor& t) { return t.defined() && !t.is_cpu() && !t.is_meta(); }

class DeviceHandoff {
 public:
  DeviceHandoff() = default;  // a CPU collective: nothing to hand off
  // On the issuing thread: marks the point of `t`'s device's current stream the collective
  // reads after (nothing for a CPU tensor).
  static DeviceHandoff at_issue(const at::Tensor& t);
  // On the comm thread: runs `run` with the group's device stream current, after the mark, and
  // returns when what it queued there is complete; runs it plainly for a CPU collective.
  void run(const ProcessGroupImpl& g, const std::function<void()>& run) const;

 private:
  std::shared_ptr<c10::Event> issued_;
};

// Each runs the whole exchange over `g`'s device backend, as collective_algorithms.h's
// counterparts (AVG divides a sum, as there).
void run_device_all_reduce(const ProcessGroupImpl& g, const at::Tensor& tensor, ReduceOp op);
void run_device_broadcast(const ProcessGroupImpl& g, const at::Tensor& tensor, int root_group_rank);
void run_device_all_gather(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input);
// Gathers rank-major into a temporary, then places each rank's block where `layout` puts it.
void run_device_all_gather_into_layout(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                                       const GatherLayout& layout);
void run_device_reduce_scatter(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                               ReduceOp op);
void run_device_all_to_all(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& output_elements, const std::vector<int64_t>& input_elements);

}  // namespace fsdpp::detail
