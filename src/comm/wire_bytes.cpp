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

}  // namespace fsdpp::detail
