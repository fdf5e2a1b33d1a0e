#include "comm/wire_bytes.h"

#include <algorithm>

#include "comm/gloo_ring_order.h"

namespace fsdpp::detail {
int64_t ring_all_reduce_bytes(int64_t total_bytes, int64_t element_size, int rank, int size) {
  if (size <= 1 || total_bytes == 0) return 0;
  // Each phase sends the segments of N-1 chunks, skipping segments past the end of the buffer.
  const GlooRingSegments s = gloo_ring_segments(total_bytes, element_size, size);
  const int64_t per_rank = s.segments / size;
  int64_t bytes = 0;
  for (int phase_offset : {1, 0}) {  // reduce-scatter sends from chunk rank+1, all-gather from chunk rank
    for (int64_t i = 0; i < s.segments - per_rank; ++i) {
      const int64_t offset = (((rank + phase_offset) * per_rank + i) * s.segment_bytes) % (s.segments * s.segment_bytes);
      bytes += std::max<int64_t>(0, std::min(s.segment_bytes, total_bytes - offset));
    }
  }
  return bytes;
}

int64_t ring_all_reduce_mean_bytes(int64_t total_bytes, int64_t size) {
  return size <= 1 ? 0 : 2 * (size - 1) * total_bytes / size;
}

int64_t all_reduce_wire_bytes(int64_t numel, int64_t element_size, bool gloo_native, int rank, int size) {
  if (size <= 1) return 0;
  if (gloo_native) return ring_all_reduce_bytes(numel * element_size, element_size, rank, size);
  const int64_t chunk_bytes = (numel + size - 1) / size * element_size;
  return 2 * (size - 1) * chunk_bytes;
}

int64_t tree_broadcast_sends(int rank, int root, int size) {
  int dim = 0;
  while ((1 << dim) < size) ++dim;
  const int vrank = (rank - root + size) % size;
  int64_t sends = 0;
  int mask = (1 << dim) - 1;
  for (int i = 0; i < dim; ++i) {
    mask ^= (1 << i);
    if ((vrank & mask) != 0) continue;
    int vpeer = vrank ^ (1 << i);
    if (vpeer >= size) continue;
    if ((vrank & (1 << i)) == 0) ++sends;
  }
  return sends;
}

int64_t broadcast_wire_bytes(int64_t bytes, int rank, int root, int size) {
  return tree_broadcast_sends(rank, root, size) * bytes;
}

int64_t broadcast_string_wire_bytes(int64_t size_bytes, int rank, int root, int size) {
  return broadcast_wire_bytes(8 + size_bytes, rank, root, size);
}

int64_t all_gather_wire_bytes(int64_t shard_bytes, int64_t size) { return (size - 1) * shard_bytes; }

int64_t reduce_scatter_wire_bytes(int64_t shard_bytes, int64_t size) { return (size - 1) * shard_bytes; }

int64_t barrier_wire_bytes() { return 0; }

int64_t all_to_all_wire_bytes(const std::vector<int64_t>& input_elements, int64_t element_size, int rank) {
  int64_t bytes = 0;
  for (size_t j = 0; j < input_elements.size(); ++j)
    if (static_cast<int>(j) != rank) bytes += input_elements[j] * element_size;
  return bytes;
}

}  // namespace fsdpp::detail
