#pragma once
// The proof that a tensor's chunks tile it exactly: every chunk inside, no two overlapping, no
// hole. Counting elements is not enough: two overlapping chunks can leave a hole of the same
// size, and the count comes out right while rows are missing. Used by the save plan, load,
// verify and the chunk reader, on sizes that may come from a hostile file (all arithmetic is
// overflow-checked).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fsdpp/checkpoint.h>

#include "checkpoint/format.h"

namespace fsdpp::checkpoint::detail {

struct TilingProblem {
  enum class Kind { kNone, kOutside, kOverlap, kHole, kTooLarge };
  Kind kind = Kind::kNone;
  size_t a = 0, b = 0;            // kOutside: box a; kOverlap: boxes a and b
  int64_t covered = 0, total = 0;  // kHole: elements the boxes hold, elements of the region
  bool hole_found = false;         // kHole: `hole` is a box no chunk covers (found when cheap)
  Box hole;
  explicit operator bool() const { return kind != Kind::kNone; }
};

// Whether `boxes` tile `region` exactly (empty boxes are allowed and hold nothing). kTooLarge:
// the region's element count does not fit in int64.
TilingProblem check_tiling(const Box& region, const std::vector<Box>& boxes);

// "offsets [2, 0] sizes [4, 4]"
std::string box_string(const Box& b);

// The problem in words, for a tensor's chunks: `label(i)` names box i, e.g. "chunk 'w@4,0'
// (offsets [2, 0] sizes [4, 4])".
std::string describe(const TilingProblem& p, const Box& region, const std::function<std::string(size_t)>& label);

// Whether a saved tensor's chunks tile its shape, in words naming the chunks ("" when they do).
std::string chunk_tiling_problem(const EntryInfo& entry);

}  // namespace fsdpp::checkpoint::detail
