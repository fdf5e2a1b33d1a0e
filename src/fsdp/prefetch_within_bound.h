#pragma once
// BACKWARD_PRE_WITHIN_BOUND's rule: from what the first backward measured, which units prefetch
// the next unit's gather at pre-backward. Pure; the one place it is written: FSDPState decides
// with it (then the ranks agree on the minimum), fsdpp-plan's step replay replays it.
#include <cstdint>
#include <vector>

namespace fsdpp::detail {

// The first backward's measurement, units by index. A unit's window runs from the moment its
// parameters are gathered to the next unit's pre-backward (where, without prefetch, that unit
// gathers); its peak is the highest tensor memory in it, less the gradient shards made meanwhile.
struct BackwardWindows {
  std::vector<int64_t> peak;       // by unit; -1: not reached
  std::vector<int> order;          // the units measured, in backward's order
  int64_t live_after_forward = 0;  // tensor bytes alive when the root's last training forward ended
};

struct PrefetchUnit {
  int64_t gathered = 0;      // its unsharded parameters as computed with: what prefetching it allocates
  int64_t reduce_input = 0;  // its reduce-scatter's input (the unsharded gradients in the reduce dtype)
  int64_t shard_group = 1;   // its shard group's size
  int target = -1;           // the unit its pre-backward would prefetch; -1: none, or not decided here
};

// In backward's order: a unit prefetches its target if its window's peak (plus the reduce-scatter
// input held over from a unit that prefetched it) plus the target stays within the larger of the
// backward's peak and live_after_forward + 2 x the largest unit, and so does the target's window
// plus this unit's reduce-scatter input and output (a prefetched gather no longer waits behind
// that reduce-scatter, whose input then outlives this window). By unit.
std::vector<bool> decide_prefetch_within_bound(const BackwardWindows& windows, const std::vector<PrefetchUnit>& units);

}  // namespace fsdpp::detail
