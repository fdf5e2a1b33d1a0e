// comm/device_handoff.h: a device collective's stream, mark, launch thread and end.
#include "comm/device_handoff.h"

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

#include "comm/process_group_impl.h"
#include "compat/cuda_runtime.h"

namespace fsdpp::detail {
namespace {

std::atomic<int64_t> g_delay_us{0};

void queue_testing_delay(const c10::Device& device) {
  const std::chrono::microseconds delay(g_delay_us.load());
  if (delay.count() <= 0) return;
  if (device.is_cpu())
    run_on_current_stream(device, [delay] { std::this_thread::sleep_for(delay); });
  else
    compat::cuda_sleep(delay);
}

// FSDP2's stream roles: all-gathers, reduce-scatters, and all-reduces (HSDP's) with the rest.
int stream_role(CollectiveKind kind) {
  switch (kind) {
    case kAllGather: return 0;
    case kReduceScatter: return 1;
    default: return 2;
  }
}


}  // namespace

void set_device_collective_delay(std::chrono::microseconds delay) { g_delay_us = delay.count(); }

bool takes_device_path(const ProcessGroupImpl& g, const at::Tensor& t) {
  if (!t.defined() || t.is_meta() || !g.device_backend) return false;
  return !t.is_cpu() || g.cpu_tensors_on_device_path;
}

DeviceHandoff DeviceHandoff::at_issue(const ProcessGroupImpl& g, CollectiveKind kind, std::vector<at::Tensor> tensors,
                                      CommStream* stream) {
  DeviceHandoff handoff;
  if (tensors.empty() || !takes_device_path(g, tensors.front())) return handoff;
  const c10::Device device = tensors.front().device();
  // The caller's stream, else the group's for this kind: streams no other group shares.
  handoff.stream_ = (stream ? *stream : g.device_streams[stream_role(kind)]).on(device);
  handoff.issued_ = std::make_shared<StreamEvent>(device.type());
  handoff.issued_->record(current_stream(device));
  handoff.completion_ = std::make_shared<DeviceCompletion>(handoff.stream_->device(), std::move(tensors));
  handoff.recorded_ = std::make_shared<bool>(false);
  handoff.launches_on_issue_ = g.device_launches_on_issue;
  handoff.blocking_wait_ = g.blocking_wait;
  handoff.timeout_ = g.timeout;
  return handoff;
}

void DeviceHandoff::run(const std::function<void()>& launch) const {
  if (!completion_) return launch();
  StreamGuard current(*stream_);
  issued_->block(*stream_);
  queue_testing_delay(stream_->device());
  LaunchingChainedCollective chained;
  try {
    launch();
  } catch (...) {
    if (!*recorded_) completion_->record(*stream_);
    throw;
  }
  if (!*recorded_) completion_->record(*stream_);
}

void DeviceHandoff::queued() const {
  if (!completion_ || *recorded_) return;
  completion_->record(*stream_);
  *recorded_ = true;
  if (blocking_wait_ && !completion_->synchronize(timeout_)) {
    completion_->abandon();
    // Not an fsdpp::Error: the submission reports who is missing, as for a host wait's timeout.
    throw std::runtime_error("timed out after " + std::to_string(timeout_.count()) +
                             " ms waiting on the device for its end (TORCH_NCCL_BLOCKING_WAIT=1)");
  }
}

}  // namespace fsdpp::detail
