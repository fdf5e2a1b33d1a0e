#pragma once
// Bytes one rank puts on the wire for each collective algorithm fsdpp uses.
// CommDebugMode reports these; bench/ checks them against the kernel's socket counters.
#include <cstdint>

namespace fsdpp::detail {

// Gloo's ring all_reduce (its segments: gloo_ring_segments, comm/gloo_ring_order.h).
int64_t ring_all_reduce_bytes(int64_t total_bytes, int64_t element_size, int rank, int size);
// Gloo's binomial-tree broadcast: how many times `rank` sends the whole buffer.
int64_t tree_broadcast_sends(int rank, int root, int size);

}  // namespace fsdpp::detail
