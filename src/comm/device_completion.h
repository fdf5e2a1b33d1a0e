#pragma once
// A device collective's end and its tensors: what a Work of a collective on a device stream
// (comm/device_handoff.h) completes at wait(), with c10d's NCCL Work's meaning. Private to fsdpp.
#include <chrono>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/device_stream.h"

namespace fsdpp::detail {

// The end is recorded on the collective's stream once it is queued there. The tensors are held
// until a waiting stream is ordered after that end: released earlier, a buffer's block could go
// to the next allocation on the stream it came from while the collective still uses it (FSDP2
// keeps its buffers until an event the same way, rather than record_stream).
class DeviceCompletion {
 public:
  DeviceCompletion(c10::Device device, std::vector<at::Tensor> tensors)
      : device_(device), done_(device.type()), tensors_(std::move(tensors)) {}
  // Never waited for: the host waits for the end before the tensors go.
  ~DeviceCompletion();
  DeviceCompletion(const DeviceCompletion&) = delete;
  DeviceCompletion& operator=(const DeviceCompletion&) = delete;

  // Once the collective is queued on `stream` (or failed to be: what it queued still runs).
  void record(const c10::Stream& stream);
  // Work::wait(): the current stream of the end's device waits for it (at every wait); the
  // tensors are released at the first wait that is not a chained collective's (below).
  void wait_on_current_stream();
  // Work::is_completed(): whether the device has run it (true if it was never queued).
  bool query();
  // The host waits for the end, up to `timeout` (forever when zero); false on timeout.
  bool synchronize(std::chrono::milliseconds timeout);
  // A collective that timed out may never end (its group is broken): its tensors are leaked, not
  // freed under it, and nothing waits for it any more.
  void abandon();

 private:
  std::mutex mutex_;
  c10::Device device_;
  StreamEvent done_;
  std::vector<at::Tensor> tensors_;
};

// While one lives on a thread, a wait on a DeviceCompletion orders only the stream of the
// collective being launched (a chained one waiting for the one before it): the tensors stay
// held, since the streams they came from are not ordered yet.
class LaunchingChainedCollective {
 public:
  LaunchingChainedCollective();
  ~LaunchingChainedCollective();
  LaunchingChainedCollective(const LaunchingChainedCollective&) = delete;
  LaunchingChainedCollective& operator=(const LaunchingChainedCollective&) = delete;

 private:
  bool previous_;
};

}  // namespace fsdpp::detail
