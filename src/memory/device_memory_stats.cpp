// memory_stats(device) and reset_peak_memory_stats(device): the CPU's from fsdpp's allocator, a
// CUDA device's from PyTorch's caching allocator (compat/cuda_runtime.h).
#include <fsdpp/error.h>
#include <fsdpp/memory.h>

#include <c10/core/impl/VirtualGuardImpl.h>

#include "compat/cuda_runtime.h"

namespace fsdpp {
namespace {

c10::DeviceIndex cuda_index(const c10::Device& device, const char* function) {
  if (!device.is_cuda())
    throw Error(std::string(function) + ": device " + device.str() + " is neither the CPU nor a CUDA device");
  if (device.has_index() || !compat::built_with_cuda()) return device.index();  // (the latter throws below)
  return c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getDevice().index();
}

}  // namespace

MemoryStats memory_stats(const c10::Device& device) {
  if (device.is_cpu()) return memory_stats();
  const auto s = compat::cuda_allocator_stats(cuda_index(device, "memory_stats"));
  return {s.allocated_bytes, s.peak_allocated_bytes, s.num_allocations, s.reserved_bytes - s.allocated_bytes};
}

void reset_peak_memory_stats(const c10::Device& device) {
  if (device.is_cpu()) return reset_peak_memory_stats();
  compat::cuda_reset_peak_stats(cuda_index(device, "reset_peak_memory_stats"));
}

}  // namespace fsdpp
