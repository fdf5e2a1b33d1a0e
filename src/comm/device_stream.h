#pragma once
// The device path's streams and events, one code for every device, as FSDP2 runs one engine on
// CUDA and on the CPU. On an accelerator they are c10's streams and events. c10 has no CPU events
// (its CPU guard refuses them), so the CPU has its own here: the compute stream is the calling
// thread itself (what it queues has run when the call returns), and a communication stream is a
// host queue, a thread of its own that runs what is queued on it in order. Over a CPU backend that
// launches asynchronously on the current stream, as NCCL does (the NCCL-contract double,
// comm/nccl_contract_backend.h), a missing wait then reads stale data, and a buffer freed without
// being recorded on the stream that reads it is a use after free, as on a GPU.
// Private to fsdpp.
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

namespace fsdpp::detail {

class HostQueue;

// The stream the calling thread queues `device`'s work on: its compute stream unless a
// StreamGuard below chose another.
c10::Stream current_stream(c10::Device device);
// Whether `stream` is a CPU one whose work runs on the calling thread at once (the CPU compute
// stream); an accelerator's streams never are.
bool runs_on_caller(const c10::Stream& stream);
// A high-priority stream of `device` for communication that no other caller of this function
// gets (FSDP2's all-gather, reduce-scatter and all-reduce streams): a pool stream on an
// accelerator (device index resolved to the current device when absent), a host queue of its own
// on the CPU.
c10::Stream new_comm_stream(c10::Device device);

// A stream of one role (FSDP2's all-gather, reduce-scatter or all-reduce stream), made by
// new_comm_stream on the device of its first use (again if a use is on another device).
class CommStream {
 public:
  c10::Stream on(c10::Device device);

 private:
  std::mutex mutex_;
  std::optional<c10::Stream> stream_;
};

// Makes `stream` its device's current stream on this thread (and, on an accelerator, its device
// the current device) until destroyed.
class StreamGuard {
 public:
  explicit StreamGuard(const c10::Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  std::optional<c10::StreamGuard> device_;
  std::optional<c10::Stream> previous_cpu_;
};

// Host code that is one step of a stream's work: on an accelerator `work` runs now and queues its
// kernels on the current stream; on a CPU host queue it is queued there, after what is queued
// already; on the CPU compute stream it runs now. For the steps of a collective that read what
// the collective wrote (AVG's division, a widened reduction's copy back, a gather's placement).
void run_on_current_stream(c10::Device device, std::function<void()> work);

// What work queued on a CPU host queue holds of `t`, as a kernel's arguments hold an address: the
// same memory through a storage of its own, so that a release of `t`'s storage on the host
// (storage_memory's, which empties the storage at once) does not take the memory from under
// work already queued; the memory itself lives as long as release_after_stream keeps it. `t`
// itself elsewhere (an accelerator's kernels take their addresses at launch).
at::Tensor kernel_argument(const at::Tensor& t);

// The block behind `ptr` is not reused until what `stream` has queued so far has run: recorded
// with the caching allocator on an accelerator (recordStream), held by the host queue on the CPU;
// freed at once on the CPU compute stream.
void release_after_stream(at::DataPtr ptr, const c10::Stream& stream);

// A point in a stream's work.
class StreamEvent {
 public:
  explicit StreamEvent(c10::DeviceType type);
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;

  // Marks what `stream` has queued so far.
  void record(const c10::Stream& stream);
  bool recorded() const { return recorded_; }
  c10::DeviceType device_type() const { return type_; }
  // `stream` runs nothing queued after this call before the mark has been reached (the calling
  // thread waits, when `stream` runs on it). Nothing when never recorded.
  void block(const c10::Stream& stream) const;
  // Whether the mark has been reached (true when never recorded).
  bool query() const;
  // The host waits for the mark, polling up to `timeout` (forever when zero); false on timeout.
  bool synchronize(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const;

 private:
  c10::DeviceType type_;
  bool recorded_ = false;
  std::optional<c10::Event> event_;  // an accelerator's
  std::shared_ptr<HostQueue> queue_;  // the CPU's: the queue and how much of it precedes the mark
  int64_t position_ = 0;
};

}  // namespace fsdpp::detail
