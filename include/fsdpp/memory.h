#pragma once
// CPU tensor memory of this process, counted by fsdpp's CPU allocator (installed when
// libfsdpp loads; tensors allocated before that are not counted).
#include <cstdint>

namespace fsdpp {

struct MemoryStats {
  int64_t current_bytes = 0;  // bytes of tensor storage alive now
  int64_t peak_bytes = 0;     // maximum of current_bytes since the last reset
  int64_t num_allocations = 0;
};

MemoryStats memory_stats();
// Sets the peak to the current value, like torch.cuda.reset_peak_memory_stats().
void reset_peak_memory_stats();

}  // namespace fsdpp
