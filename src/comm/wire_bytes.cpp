#include "comm/wire_bytes.h"

#include <algorithm>

namespace fsdpp::detail {
namespace {
int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }
}  // namespace

int64_t ring_all_reduce_bytes(int64_t total_bytes, int64_t element_size, int rank, int size) {
  if (size <= 1 || total_bytes == 0) return 0;
  // Mirrors the segment arithmetic of Gloo's ring: each phase sends the segments of N-1
  // chunks, skipping segments past the end of the buffer. Checked against the kernel's count
  // of bytes written (bench/bench_collectives).
  const int64_t max_segment = element_size * ((int64_t{1} << 20) / element_size);
  const int64_t segment = round_up(std::min((total_bytes + 2 * size - 1) / (2 * size), max_segment), element_size);
  const int64_t segments =
      round_up(std::max((total_bytes + segment - 1) / segment, int64_t{2} * size), int64_t{size});
  const int64_t per_rank = segments / size;
  int64_t bytes = 0;
  for (int phase_offset : {1, 0}) {  // reduce-scatter sends from chunk rank+1, all-gather from chunk rank
    for (int64_t i = 0; i < segments - per_rank; ++i) {
      int64_t offset = (((rank + phase_offset) * per_rank + i) * segment) % (segments * segment);
      bytes += std::max<int64_t>(0, std::min(segment, total_bytes - offset));
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
