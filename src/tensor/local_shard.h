#pragma once
// The chunk rule (torch.chunk's, as DTensor's Shard(d) uses it): `extent` slices of a dim split
// over `num_chunks` ranks, every rank's chunk ceil(extent / num_chunks) slices (the extent FSDP
// pads each rank's storage to), so the last ranks hold fewer or none. The one place it is
// written: TensorLayout shards by it, tensor parallelism splits activations by it, fsdpp-plan
// sizes shards by it. Private to fsdpp.
#include <algorithm>
#include <cstdint>

namespace fsdpp::detail {

struct LocalShard {
  int64_t size = 0;    // the slices rank holds
  int64_t offset = 0;  // where they start along the dim (the extent for a rank holding none)
  int64_t padded = 0;  // every rank's chunk: ceil(extent / num_chunks)
};

// PyTorch's Shard.local_shard_size_and_offset, with the padded chunk beside it.
inline LocalShard local_shard_size_and_offset(int64_t extent, int64_t num_chunks, int64_t rank) {
  const int64_t padded = (extent + num_chunks - 1) / num_chunks;
  const int64_t offset = std::min(rank * padded, extent);
  return {std::min(padded, extent - offset), offset, padded};
}

}  // namespace fsdpp::detail
