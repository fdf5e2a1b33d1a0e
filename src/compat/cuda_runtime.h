#pragma once
// What fsdpp needs of CUDA beyond c10's device-generic streams and events: NCCL's c10d backend
// and the CUDA caching allocator's statistics. Their headers exist only in a CUDA-enabled
// libtorch (PyPI's), so CMake compiles cuda/cuda_runtime.cpp against one and
// cuda/no_cuda_runtime.cpp against a CPU-only one (Debian's), whose functions say so.
#include <chrono>
#include <cstdint>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "compat/c10d_backend.h"

namespace fsdpp::compat {

// Whether this libfsdpp was built against a CUDA-enabled libtorch.
bool built_with_cuda();
// How many CUDA devices this process sees (0 without CUDA).
int cuda_device_count();

// c10d's ProcessGroupNCCL of `size` ranks meeting on `store`; its communicators are made at
// the first collective on a device. Throws fsdpp::Error without CUDA or a CUDA device.
c10::intrusive_ptr<C10dBackend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                  int size, std::chrono::milliseconds timeout);

// Shuts a backend make_nccl_backend made down (its communicators destroyed, as PyTorch's
// destroy_process_group does; destroyed without it, ProcessGroupNCCL warns and aborts them).
// Nothing for any other backend.
void shutdown_nccl_backend(const c10::intrusive_ptr<C10dBackend>& backend);

// The caching allocator's counts for one device (torch.cuda.memory_stats()'s "all" entries);
// zeros before the process's first CUDA allocation, as torch.cuda.memory_stats() is then empty.
struct CudaAllocatorStats {
  int64_t allocated_bytes = 0, peak_allocated_bytes = 0, reserved_bytes = 0, num_allocations = 0;
};
CudaAllocatorStats cuda_allocator_stats(c10::DeviceIndex device);
void cuda_reset_peak_stats(c10::DeviceIndex device);
// Returns the allocator's cached, unused blocks to the driver.
void cuda_empty_cache();

// Enqueues a kernel that spins for about `duration` on the current stream of the current CUDA
// device (at::cuda::sleep, whose argument is GPU cycles: converted with a rate measured once per
// process, as PyTorch's get_cycles_per_ms does). What stands in for compute and communication in
// timing tests and in the fake backend's testing delay (comm/fake_backend.h).
void cuda_sleep(std::chrono::microseconds duration);

}  // namespace fsdpp::compat
