#pragma once
// Freed CPU blocks kept for reuse, keyed by exact size, as c10's mobile CPUCachingAllocator
// does (PyTorch's CUDA caching allocator keeps blocks too, but rounds and splits them). A
// training step frees and re-allocates the same sizes every iteration (FSDP's unit-sized
// buffers, activations, gradients); handing those blocks back to the kernel and faulting fresh
// pages in again costs more than the arithmetic on them (bench_fresh_pages on the benchmark
// VM: touching a fresh 3 MiB block 8-19 ms, a reused one 0.03 ms; docs/benchmarks.md).
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace fsdpp::detail {

class CPUBlockCache {
 public:
  // fork_safe: the cache's lock is held across fork() (for the process-wide cache; one per process).
  explicit CPUBlockCache(bool fork_safe = false);

  // Blocks below this come from malloc's arenas, which reuse them without faulting.
  static constexpr size_t kMinBytes = size_t{64} << 10;

  // Sizes are what the allocator was asked for (a block may be larger by its header), so the
  // cache counts in the units of memory_stats().
  // A cached block of exactly `nbytes`, or nullptr.
  void* take(size_t nbytes);
  // Keeps a freed block if caching is on and the cache stays within `limit` bytes (evicting
  // the blocks cached longest ago to make room); false: the caller frees it.
  bool keep(void* block, size_t nbytes, int64_t limit);
  // Frees every cached block.
  void clear();
  void set_enabled(bool enabled);
  int64_t cached_bytes() const;

 private:
  struct Block {
    void* ptr;
    size_t nbytes;
  };
  // Drops the oldest block from the bookkeeping (lock held); the caller frees it.
  void* evict_oldest();

  mutable std::mutex mutex_;
  bool enabled_ = true;
  int64_t cached_bytes_ = 0;
  std::list<Block> by_age_;  // oldest first
  std::unordered_map<size_t, std::vector<std::list<Block>::iterator>> by_size_;
};

}  // namespace fsdpp::detail
