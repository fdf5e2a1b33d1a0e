#pragma once
// Replays one training step's allocations on one rank: the tape's forward and backward
// (autograd_tape.h) interleaved with fully_shard's schedule as src/fsdp/ runs it. Forward: the
// root gathers itself and prefetches the first block; each block waits for its gather, then
// prefetches the next; blocks reshard after forward, the root stays gathered. Backward: a unit's
// pre-backward waits for its gather and (by the prefetch mode) gathers the next unit to run
// backward; its post-backward finalizes the previous unit's reduce-scatter (the gradient shard
// copied out, the output freed), reshards, packs the reduce-scatter input (then the unsharded
// gradients go), allocates the output and frees the input once exchanged; the root's
// post-backward and the last finalize run in the final callback. A collective is taken to finish
// before the next one on the same comm thread starts.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fsdpp/plan.h>

#include "plan/autograd_tape.h"

namespace fsdpp::plan::detail {

struct UnitBytes {
  int64_t gathered = 0;         // unsharded padded, param dtype
  int64_t gather_input = 0;     // a cast or host->device copy of the shard, 0 when it is the shard
  int64_t grads = 0;            // unsharded gradients (param dtype)
  int64_t reduce_input = 0;     // unsharded padded, reduce dtype
  int64_t reduce_output = 0;    // shard padded, reduce dtype
  int64_t reduce_staging = 0;   // the comm thread's temporaries of the reduce-scatter
  int64_t grad_shard = 0;       // the rank's .grad on the device (0 under CPU offload)
};

struct ReplayOptions {
  bool reshard_after_forward = true;
  bool activation_checkpointing = false;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kBounded;
  // A group of one's reduce-scatter is a copy, finished when its unit's post-backward ends;
  // otherwise its output waits for the next unit's post-backward.
  int64_t shard_group_size = 1;
  bool trace = false;  // record live bytes after each op and FSDP event
  bool comm_thread_late = false;  // the slow order (above); false: the benign one
};

struct ReplayResult {
  int64_t forward_peak = 0, after_forward = 0, backward_peak = 0, activations = 0;
  // The same step's peaks in the slow order (replay_step fills them; 0 in a single replay).
  int64_t forward_peak_late = 0, backward_peak_late = 0;
  // The slow order's peaks had the comm thread run a queued gather at the worst moment before
  // its wait: its output allocated while its input is still alive (replay_step fills them).
  int64_t forward_peak_in_flight = 0, backward_peak_in_flight = 0;
  int64_t at_peak_params = 0, at_peak_grads = 0, at_peak_comm = 0, at_peak_activations = 0, at_peak_temporaries = 0;
  std::vector<std::pair<std::string, int64_t>> trace;  // (event, live bytes after it)
  // kBounded: whether each unit prefetched (the decision of the replay without prefetch).
  std::vector<bool> prefetched_within_bound;
};

// units[0] is the root, units[1 + i] block i (the tape's unit numbers). kBounded replays the
// engine's BACKWARD_PRE_WITHIN_BOUND (src/fsdp/fsdp_state.cpp): a replay without prefetch
// measures each unit's window as the first backward does, the rule decides which units
// prefetch, and the step is replayed with those. The step is replayed in both orders (the trace
// is the benign one's, then the slow one's).
ReplayResult replay_step(const Tape& tape, const std::vector<UnitBytes>& units, const ReplayOptions& options);

}  // namespace fsdpp::plan::detail
