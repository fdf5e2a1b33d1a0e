#include "comm/gloo_ring_order.h"

#include <algorithm>

namespace fsdpp::detail {

GlooRingSegments gloo_ring_segments(int64_t bytes, int64_t element_size, int size) {
  // gloo/allreduce.cc ring(): maxSegmentBytes, numSegments, segmentBytes, in that order
  // (kMaxSegmentSize is 1 MiB, gloo/allreduce.h).
  const int64_t max_segment_bytes = element_size * std::max<int64_t>(1, (int64_t{1} << 20) / element_size);
  int64_t segments = std::max((bytes + max_segment_bytes - 1) / max_segment_bytes, int64_t{2} * size);
  segments = (segments + size - 1) / size * size;
  const int64_t segment_bytes = ((bytes + segments - 1) / segments + element_size - 1) / element_size * element_size;
  return {segments, segment_bytes};
}

int64_t gloo_ring_chunk_numel(int64_t numel, int64_t element_size, int size) {
  const GlooRingSegments s = gloo_ring_segments(numel * element_size, element_size, size);
  return std::max<int64_t>(1, s.segments / size * (s.segment_bytes / element_size));  // 1 for an empty buffer
}

}  // namespace fsdpp::detail
