// compat/cuda_runtime.h against a CUDA-enabled libtorch: built as an object of its own with
// USE_C10D_NCCL (c10d's NCCL header is compiled only with it) and NCCL's header on its path.
#include "compat/cuda_runtime.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <fsdpp/error.h>

#include <c10/util/Exception.h>

namespace fsdpp::compat {

bool built_with_cuda() { return true; }

int cuda_device_count() { return static_cast<int>(c10::cuda::device_count()); }

c10::intrusive_ptr<C10dBackend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                  int size, std::chrono::milliseconds timeout) {
  if (cuda_device_count() == 0)
    throw Error("backend 'nccl' needs a CUDA device and this process sees none (rank " + std::to_string(rank) +
                " of " + std::to_string(size) + "); use 'gloo' for CPU tensors");
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  try {
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  } catch (const c10::Error& e) {
    throw Error("backend 'nccl' could not be created at rank " + std::to_string(rank) + " of " + std::to_string(size) +
                ": " + e.what_without_backtrace());
  }
}

namespace {

void require_device(c10::DeviceIndex device, const char* function) {
  if (device < 0 || device >= cuda_device_count())
    throw Error(std::string(function) + " of cuda:" + std::to_string(device) + ": this process sees " +
                std::to_string(cuda_device_count()) + " CUDA device(s)");
}

// Before this process's first CUDA allocation the allocator has no devices yet and its
// statistics throw ("Invalid device argument"); torch.cuda.memory_stats() is empty then.
bool allocator_initialized() { return c10::cuda::CUDACachingAllocator::get()->initialized(); }

}  // namespace

void shutdown_nccl_backend(const c10::intrusive_ptr<C10dBackend>& backend) {
  if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(backend.get())) nccl->shutdown();
}

CudaAllocatorStats cuda_allocator_stats(c10::DeviceIndex device) {
  require_device(device, "memory_stats()");
  if (!allocator_initialized()) return {};
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  constexpr size_t all = 0;  // StatType::AGGREGATE, whose namespace moved between releases
  CudaAllocatorStats s;
  s.allocated_bytes = stats.allocated_bytes[all].current;
  s.peak_allocated_bytes = stats.allocated_bytes[all].peak;
  s.reserved_bytes = stats.reserved_bytes[all].current;
  s.num_allocations = stats.allocation[all].allocated;
  return s;
}

void cuda_reset_peak_stats(c10::DeviceIndex device) {
  require_device(device, "reset_peak_memory_stats()");
  if (allocator_initialized()) c10::cuda::CUDACachingAllocator::resetPeakStats(device);
}

void cuda_empty_cache() {
  if (cuda_device_count() > 0 && allocator_initialized()) c10::cuda::CUDACachingAllocator::emptyCache();
}

namespace {

// PyTorch's get_cycles_per_ms: ten timed sleeps of a million cycles, the mean of the middle six
// (the clock boosts and throttles; the extremes are the warm-up and the outliers).
double measure_cycles_per_ms() {
  constexpr int64_t kCycles = 1000000;
  std::vector<double> rates;
  for (int i = 0; i < 10; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
    const auto stream = c10::cuda::getCurrentCUDAStream();
    start.record(stream);
    at::cuda::sleep(kCycles);
    end.record(stream);
    end.synchronize();
    rates.push_back(kCycles / static_cast<double>(start.elapsed_time(end)));
  }
  std::sort(rates.begin(), rates.end());
  double sum = 0;
  for (size_t i = 2; i < rates.size() - 2; ++i) sum += rates[i];
  return sum / static_cast<double>(rates.size() - 4);
}

}  // namespace

void cuda_sleep(std::chrono::microseconds duration) {
  if (cuda_device_count() == 0) throw Error("a CUDA sleep kernel needs a CUDA device and this process sees none");
  static std::once_flag measured;
  static double cycles_per_ms = 0;
  std::call_once(measured, [] { cycles_per_ms = measure_cycles_per_ms(); });
  at::cuda::sleep(static_cast<int64_t>(cycles_per_ms * static_cast<double>(duration.count()) / 1000.0));
}

}  // namespace fsdpp::compat
