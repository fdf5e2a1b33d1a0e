#pragma once
// Bytes one rank puts on the wire for each collective fsdpp runs: the one rule for each kind,
// read by the collectives (what CommDebugMode reports, comm/collectives.cpp) and by fsdpp-plan
// (plan/plan_step.cpp). bench/ checks them against the kernel's socket counters.
#include <cstdint>
#include <vector>

namespace fsdpp::detail {

// Gloo's ring all_reduce (its segments: gloo_ring_segments, comm/gloo_ring_order.h).
int64_t ring_all_reduce_bytes(int64_t total_bytes, int64_t element_size, int rank, int size);
// The mean over the ranks of ring_all_reduce_bytes: 2 (n - 1) / n of the buffer, segment
// rounding aside (every segment is sent n - 1 times in each phase). fsdpp-plan's figure, which
// names no rank of the group and no transport: a ring's, as NCCL and Gloo's native dtypes send it
// (on Gloo, a dtype it cannot reduce takes all_reduce_wire_bytes' chunked path: up to n - 1
// elements more per phase).
int64_t ring_all_reduce_mean_bytes(int64_t total_bytes, int64_t size);
// all_reduce of `numel` elements: Gloo's ring when Gloo reduces the dtype (`gloo_native`), else
// fsdpp's own reduce-scatter and all-gather of ceil(numel / n)-element chunks.
int64_t all_reduce_wire_bytes(int64_t numel, int64_t element_size, bool gloo_native, int rank, int size);
// Gloo's binomial-tree broadcast: how many times `rank` sends the whole buffer.
int64_t tree_broadcast_sends(int rank, int root, int size);
// broadcast of `bytes` bytes from `root`.
int64_t broadcast_wire_bytes(int64_t bytes, int rank, int root, int size);
// broadcast_bytes (the collective) of a `size_bytes`-byte string: its 8-byte length, then its bytes.
int64_t broadcast_string_wire_bytes(int64_t size_bytes, int rank, int root, int size);
// all_gather of a `shard_bytes`-byte input: it goes to each of the other ranks.
int64_t all_gather_wire_bytes(int64_t shard_bytes, int64_t size);
// reduce_scatter into a `shard_bytes`-byte output: each other rank's chunk leaves this one.
int64_t reduce_scatter_wire_bytes(int64_t shard_bytes, int64_t size);
// barrier: Gloo's exchanges notifications only, no payload.
int64_t barrier_wire_bytes();
// all_to_all of `input_elements[j]` elements to rank j: all but this rank's own.
int64_t all_to_all_wire_bytes(const std::vector<int64_t>& input_elements, int64_t element_size, int rank);

}  // namespace fsdpp::detail
