#pragma once
// The order in which Gloo's ring all_reduce (gloo/allreduce.cc, ring(); ProcessGroupGloo's
// allreduce of a dense CPU tensor never picks another algorithm) adds the ranks' values, so that
// fsdpp's own all_reduce can give its very bits. Private to fsdpp.
//
// Gloo cuts the buffer into S = roundUp(max(ceil(bytes / 1 MiB), 2 N), N) segments of
// ceil(numel / S) elements; chunk c, the S / N segments from c * S / N on, ends reduced on rank
// c. Its partial sum starts on rank c - 1 and travels down the ring, each rank adding its own
// values, so every element of chunk c is ((x[c-1] + x[c-2]) + ...) + x[c] (ranks modulo N),
// each addition rounded to the dtype (float16 too). The all-gather after it only moves bytes.
// The same in the gloo PyTorch 1.13 pinned (5b14351, Debian 12's libgloo), Debian 13's (5354032),
// gloo's 2025 head and the Gloo in PyTorch 2.15's wheel (the shared-memory transport's same-bits
// tests pass against it).
#include <cstdint>

namespace fsdpp::detail {

// How Gloo's ring all_reduce cuts a buffer of `bytes` bytes of `element_size`-byte elements over
// `size` ranks: `segments` segments of `segment_bytes` each (the last ones may be short or
// empty), segments / size of them per chunk.
struct GlooRingSegments {
  int64_t segments = 0;
  int64_t segment_bytes = 0;
};
GlooRingSegments gloo_ring_segments(int64_t bytes, int64_t element_size, int size);

// Elements per chunk of Gloo's ring all_reduce of `numel` elements of `element_size` bytes over
// `size` ranks: element e belongs to chunk e / gloo_ring_chunk_numel(...) (the last chunks may
// be short or empty).
int64_t gloo_ring_chunk_numel(int64_t numel, int64_t element_size, int size);

// The rank whose values enter chunk c's sum at step k (k = 0 .. size-1; k = 0 starts it).
inline int gloo_ring_summand(int64_t chunk, int k, int size) {
  return static_cast<int>(((chunk - 1 - k) % size + size) % size);
}

}  // namespace fsdpp::detail
