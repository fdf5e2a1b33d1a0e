#include "fsdp/prefetch_within_bound.h"

#include <algorithm>

namespace fsdpp::detail {

std::vector<bool> decide_prefetch_within_bound(const BackwardWindows& windows, const std::vector<PrefetchUnit>& units) {
  int64_t largest = 0, backward_peak = 0;
  for (const auto& u : units) largest = std::max(largest, u.gathered);
  for (int64_t p : windows.peak) backward_peak = std::max(backward_peak, p);
  const int64_t bound = std::max(backward_peak, windows.live_after_forward + 2 * largest);
  std::vector<bool> prefetches(units.size(), false);
  std::vector<int64_t> held_over(units.size(), 0);  // a reduce-scatter's buffers in the window
  for (int s : windows.order) {
    const int target = units[s].target;
    if (target < 0 || windows.peak[s] < 0) continue;
    // The reduce-scatter's input and output.
    const int64_t reduce = units[s].reduce_input * (units[s].shard_group + 1) / units[s].shard_group;
    const bool fits_here = windows.peak[s] + held_over[s] + units[target].gathered <= bound;
    const bool fits_there = windows.peak[target] < 0 || windows.peak[target] + reduce <= bound;
    if (fits_here && fits_there) {
      prefetches[s] = true;
      held_over[target] = reduce;
    }
  }
  return prefetches;
}

}  // namespace fsdpp::detail
