// comm/device_completion.h: a device collective's end, waited for as c10d's NCCL Work.
#include "comm/device_completion.h"

namespace fsdpp::detail {
namespace {
thread_local bool t_launching_chained = false;
}  // namespace

LaunchingChainedCollective::LaunchingChainedCollective() : previous_(t_launching_chained) {
  t_launching_chained = true;
}
LaunchingChainedCollective::~LaunchingChainedCollective() { t_launching_chained = previous_; }

DeviceCompletion::~DeviceCompletion() {
  if (tensors_.empty()) return;
  try {
    done_.synchronize();
  } catch (...) {  // a failed device: nothing left to protect
  }
}

void DeviceCompletion::record(const c10::Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  done_.record(stream);
}

void DeviceCompletion::wait_on_current_stream() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_.recorded()) return;  // never queued
  // Every wait orders its own stream (a second waiter's too), as c10d's NCCL Work.
  done_.block(current_stream(device_));
  if (!t_launching_chained) tensors_.clear();
}

bool DeviceCompletion::query() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_.query();
}

void DeviceCompletion::abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  new std::vector<at::Tensor>(std::move(tensors_));  // never freed, on purpose
  tensors_.clear();
}

bool DeviceCompletion::synchronize(std::chrono::milliseconds timeout) {
  // Not under the lock: a waiter on another thread must not wait behind this one.
  return done_.synchronize(timeout);
}

}  // namespace fsdpp::detail
