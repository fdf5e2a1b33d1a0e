#pragma once
// Live bytes of one rank through a replayed step, by what they are, with the peak and what was
// alive at it: the counting allocator's current and peak bytes (include/fsdpp/memory.h), split.
#include <array>
#include <cstdint>

namespace fsdpp::plan::detail {

enum class Bytes {
  kGatheredParams,   // unsharded parameters of units computing (the root through backward)
  kUnitGrads,        // unsharded parameter gradients before their reduce-scatter
  kCommBuffers,      // prefetched gathers, reduce-scatter inputs and outputs
  kActivations,      // tensors autograd saved
  kTemporaries,      // forward temporaries and activation gradients
  kGradShards,       // the sharded .grad the optimizer reads (dropped by zero_grad)
  kCount
};

class MemoryTimeline {
 public:
  void alloc(Bytes kind, int64_t bytes);
  void free(Bytes kind, int64_t bytes);
  void move(Bytes from, Bytes to, int64_t bytes);
  // Bytes that may be alive on top of live() at any moment until set again (the output of a
  // collective another thread may run at any instant): counted in peak_with_transient() only.
  void set_transient(int64_t bytes);
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  int64_t peak_with_transient() const { return peak_with_transient_; }
  int64_t of(Bytes kind) const { return by_kind_[static_cast<size_t>(kind)]; }
  int64_t at_peak(Bytes kind) const { return at_peak_[static_cast<size_t>(kind)]; }
  // The highest live bytes since the last mark() (src/memory/peak_since_mark.h's counterpart).
  void mark() { peak_since_mark_ = live_; }
  int64_t peak_since_mark() const { return peak_since_mark_; }

 private:
  int64_t live_ = 0, peak_ = 0, peak_since_mark_ = 0, transient_ = 0, peak_with_transient_ = 0;
  std::array<int64_t, static_cast<size_t>(Bytes::kCount)> by_kind_{}, at_peak_{};
};

}  // namespace fsdpp::plan::detail
