#pragma once
// Collectives on accelerator (CUDA) tensors. They run on the group's comm thread like every other
// collective, so a group keeps one order whatever the device, but through the c10d backend the
// group holds for devices (ProcessGroupNCCL, or ProcessGroupGloo, which stages CUDA tensors
// through pinned host memory) instead of fsdpp's own transports, which move host bytes.
// Streams, as FSDP2's: the issuing thread's current stream is marked when the collective is
// submitted (DeviceHandoff::at_issue); on the comm thread the backend runs on one of the group's
// high-priority streams (all-gather, reduce-scatter, or all-reduce and the rest, so a prefetch
// and a reduce-scatter can overlap) after that mark, so it reads what was computed before the
// call and nothing later. The comm thread only queues it there: the Work completes when it is
// queued, and Work::wait() makes the waiting thread's current stream wait for its end, as c10d's
// NCCL Work does. The collective's tensors are held until then. TORCH_NCCL_BLOCKING_WAIT=1 makes
// the comm thread wait for the end on the host instead (a collective's failure or timeout then
// reaches its Work, and the hang report names who is missing). Private to fsdpp.
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <fsdpp/collectives.h>

#include "comm/collective_intent.h"
#include "comm/gather_layout.h"

namespace fsdpp::detail {

struct ProcessGroupImpl;

// Whether a tensor's collectives take the device path below.
inline bool on_device(const at::Tensor& t) { return t.defined() && !t.is_cpu() && !t.is_meta(); }

// A device collective's end (recorded on its stream once queued there) and its tensors, held
// until a waiting stream is ordered after that end: released earlier, a buffer's block could go
// to the next allocation on the stream it came from while the collective still uses it (FSDP2
// keeps its buffers until an event the same way, rather than record_stream).
class DeviceCompletion {
 public:
  DeviceCompletion(c10::DeviceType type, std::vector<at::Tensor> tensors) : done_(type), tensors_(std::move(tensors)) {}
  // Never waited for: the host waits for the end before the tensors go.
  ~DeviceCompletion();
  DeviceCompletion(const DeviceCompletion&) = delete;
  DeviceCompletion& operator=(const DeviceCompletion&) = delete;
  // On the comm thread, once the collective is queued on `stream`.
  void record(const c10::Stream& stream);
  // Work::wait(): the current stream of the end's device waits for it (at every wait); the
  // tensors are released at the first wait off a comm thread.
  void wait_on_current_stream();
  // Work::is_completed(): whether the device has run it (true if it failed to be queued).
  bool query();

 private:
  std::mutex mutex_;
  c10::Event done_;
  std::vector<at::Tensor> tensors_;
};

class DeviceHandoff {
 public:
  DeviceHandoff() = default;  // a CPU collective: nothing to hand off
  // On the issuing thread: marks the point of `tensors[0]`'s device's current stream the
  // collective reads after and holds the tensors (nothing for CPU tensors). `kind` picks the
  // group's stream.
  static DeviceHandoff at_issue(CollectiveKind kind, std::vector<at::Tensor> tensors);
  // On the comm thread: runs `run` with the group's stream for this kind current, after the
  // mark, and records the completion there (under TORCH_NCCL_BLOCKING_WAIT=1, returns once what
  // it queued is done); runs it plainly for a CPU collective. A Work `run` waits for (a chained
  // collective's) orders that stream after it.
  void run(const ProcessGroupImpl& g, const std::function<void()>& run) const;
  // What Work::wait() completes on the waiting thread; null for a CPU collective.
  const std::shared_ptr<DeviceCompletion>& completion() const { return completion_; }

 private:
  CollectiveKind kind_ = kBarrier;
  std::shared_ptr<c10::Event> issued_;
  std::shared_ptr<DeviceCompletion> completion_;
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
