#include "plan/memory_timeline.h"

#include <algorithm>

namespace fsdpp::plan::detail {

void MemoryTimeline::alloc(Bytes kind, int64_t bytes) {
  live_ += bytes;
  by_kind_[static_cast<size_t>(kind)] += bytes;
  if (live_ > peak_since_mark_) peak_since_mark_ = live_;
  if (live_ > peak_) {
    peak_ = live_;
    at_peak_ = by_kind_;
  }
  peak_with_transient_ = std::max(peak_with_transient_, live_ + transient_);
}

void MemoryTimeline::set_transient(int64_t bytes) {
  transient_ = bytes;
  peak_with_transient_ = std::max(peak_with_transient_, live_ + transient_);
}

void MemoryTimeline::free(Bytes kind, int64_t bytes) {
  live_ -= bytes;
  by_kind_[static_cast<size_t>(kind)] -= bytes;
}

void MemoryTimeline::move(Bytes from, Bytes to, int64_t bytes) {
  by_kind_[static_cast<size_t>(from)] -= bytes;
  by_kind_[static_cast<size_t>(to)] += bytes;
}

}  // namespace fsdpp::plan::detail
