#pragma once
// CPU tensor memory of this process, counted by fsdpp's CPU allocator (installed when
// libfsdpp loads; tensors allocated before that are not counted); a CUDA device's, from
// PyTorch's CUDA caching allocator.
#include <cstdint>

#include <c10/core/Device.h>

namespace fsdpp {

struct MemoryStats {
  int64_t current_bytes = 0;  // bytes of tensor storage alive now
  int64_t peak_bytes = 0;     // maximum of current_bytes since the last reset
  int64_t num_allocations = 0;
  int64_t cached_bytes = 0;   // freed blocks kept for reuse, not counted in current_bytes
};

MemoryStats memory_stats();
// Sets the peak to the current value, like torch.cuda.reset_peak_memory_stats().
void reset_peak_memory_stats();
// The same for `device`: the CPU's as above; a CUDA device's (index -1: the current one) as
// torch.cuda.memory_stats(device) counts them: current_bytes its "allocated_bytes.all.current",
// peak_bytes their peak, num_allocations its allocations, cached_bytes what it reserved beyond
// what is allocated. A CUDA device with a libfsdpp built without CUDA throws fsdpp::Error.
MemoryStats memory_stats(const c10::Device& device);
void reset_peak_memory_stats(const c10::Device& device);
// Freed blocks of 64 KiB and more are kept for reuse by the next allocation of the same size,
// up to the highest current_bytes ever reached (docs/api.md, "Memory").
// empty_cache() returns them to the system, like torch.cuda.empty_cache().
void empty_cache();
// Turns that caching off (emptying the cache) or back on; on by default.
void set_allocator_caching(bool enabled);

// A memory limit per process that behaves like a GPU's: an allocation that would take
// current_bytes past `bytes` first empties the cache, then throws c10::OutOfMemoryError naming
// the bytes asked for, the bytes in use and the limit (inside FSDP also the unit). The process
// stays able to report and exit. 0 (the default) means no limit.
void set_memory_limit(int64_t bytes);
int64_t memory_limit();

}  // namespace fsdpp
