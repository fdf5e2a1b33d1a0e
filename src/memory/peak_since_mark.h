#pragma once
// A second peak of memory_stats().current_bytes, for fsdpp's own measurements (FSDP's backward
// prefetch decision): marking it leaves the user's peak_bytes and reset_peak_memory_stats alone.
#include <cstdint>

namespace fsdpp::detail {

// The highest current_bytes since the last mark_peak_bytes() (or since the process started).
int64_t peak_bytes_since_mark();
// From now on the peak starts at current_bytes.
void mark_peak_bytes();

}  // namespace fsdpp::detail
