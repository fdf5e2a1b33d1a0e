// Exact tiling of a box by chunks: inside, disjoint, and together as large as the box.
#include "checkpoint/tiling.h"

#include <algorithm>

namespace fsdpp::checkpoint::detail {

namespace {

bool empty_box(const Box& b) {
  for (int64_t s : b.sizes)
    if (s == 0) return true;
  return false;
}

// Boxes are inside `region` (checked) and disjoint, but cover less of it: one box of the grid
// their boundaries draw that no box touches. Gives up (false) when the grid is large.
bool find_hole(const Box& region, const std::vector<Box>& boxes, Box& hole) {
  const size_t dims = region.sizes.size();
  std::vector<std::vector<int64_t>> cuts(dims);
  double cells = 1;
  for (size_t d = 0; d < dims; ++d) {
    cuts[d] = {region.offsets[d], region.offsets[d] + region.sizes[d]};
    for (const auto& b : boxes) {
      cuts[d].push_back(b.offsets[d]);
      cuts[d].push_back(b.offsets[d] + b.sizes[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    cells *= static_cast<double>(cuts[d].size() - 1);
  }
  if (cells * static_cast<double>(std::max<size_t>(1, boxes.size())) > 2e7) return false;
  // Each grid cell lies wholly inside a box or touches none; walk them in row-major order.
  std::vector<size_t> at(dims, 0);
  for (;;) {
    Box cell{std::vector<int64_t>(dims), std::vector<int64_t>(dims)};
    for (size_t d = 0; d < dims; ++d) {
      cell.offsets[d] = cuts[d][at[d]];
      cell.sizes[d] = cuts[d][at[d] + 1] - cuts[d][at[d]];
    }
    Box common;
    bool covered = false;
    for (const auto& b : boxes)
      if (intersect(b, cell, common)) covered = true;
    if (!covered) {
      hole = cell;
      return true;
    }
    size_t d = dims;
    while (d > 0 && ++at[d - 1] + 1 == cuts[d - 1].size()) at[--d] = 0;
    if (d == 0) return false;
  }
}

}  // namespace

TilingProblem check_tiling(const Box& region, const std::vector<Box>& boxes) {
  TilingProblem p;
  const size_t dims = region.sizes.size();
  std::vector<int64_t> region_end(dims);
  bool fits = checked_numel(region.sizes, p.total);
  for (size_t d = 0; fits && d < dims; ++d) fits = checked_add(region.offsets[d], region.sizes[d], region_end[d]);
  if (!fits) {
    p.kind = TilingProblem::Kind::kTooLarge;
    return p;
  }
  // Inside, with no sum that can wrap: offset >= start, size >= 0, offset + size <= end.
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Box& b = boxes[i];
    bool inside = b.offsets.size() == dims && b.sizes.size() == dims;
    for (size_t d = 0; inside && d < dims; ++d) {
      int64_t end = 0;
      inside = b.offsets[d] >= region.offsets[d] && b.sizes[d] >= 0 && checked_add(b.offsets[d], b.sizes[d], end) &&
               end <= region_end[d];
    }
    if (!inside) {
      p.kind = TilingProblem::Kind::kOutside;
      p.a = i;
      return p;
    }
  }
  // Disjoint: sweep along dim 0 (a box can only meet the ones starting before it ends there).
  std::vector<size_t> order;
  for (size_t i = 0; i < boxes.size(); ++i)
    if (!empty_box(boxes[i])) order.push_back(i);
  auto start = [&](size_t i) { return dims ? boxes[i].offsets[0] : 0; };
  auto stop = [&](size_t i) { return dims ? boxes[i].offsets[0] + boxes[i].sizes[0] : 1; };
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return start(x) < start(y); });
  for (size_t i = 0; i < order.size(); ++i) {
    for (size_t j = i + 1; j < order.size() && start(order[j]) < stop(order[i]); ++j) {
      Box common;
      if (intersect(boxes[order[i]], boxes[order[j]], common)) {
        p.kind = TilingProblem::Kind::kOverlap;
        p.a = std::min(order[i], order[j]);
        p.b = std::max(order[i], order[j]);
        return p;
      }
    }
  }
  // Disjoint and inside: the sum cannot exceed the region's count, so it cannot wrap.
  for (size_t i : order) p.covered += numel(boxes[i].sizes);
  if (p.covered == p.total) return p;
  p.kind = TilingProblem::Kind::kHole;
  std::vector<Box> nonempty;
  for (size_t i : order) nonempty.push_back(boxes[i]);
  p.hole_found = find_hole(region, nonempty, p.hole);
  return p;
}

std::string box_string(const Box& b) { return "offsets " + shape_string(b.offsets) + " sizes " + shape_string(b.sizes); }

std::string describe(const TilingProblem& p, const Box& region, const std::function<std::string(size_t)>& label) {
  const std::string where = box_string(region);
  switch (p.kind) {
    case TilingProblem::Kind::kNone: return "";
    case TilingProblem::Kind::kTooLarge:
      return "the region " + where + " has more elements than a 64-bit count holds";
    case TilingProblem::Kind::kOutside: return label(p.a) + " lies outside " + where;
    case TilingProblem::Kind::kOverlap: return label(p.a) + " and " + label(p.b) + " overlap";
    case TilingProblem::Kind::kHole:
      return "the chunks hold " + std::to_string(p.covered) + " of the " + std::to_string(p.total) +
             " elements at " + where + "; " +
             (p.hole_found ? "no chunk holds " + box_string(p.hole) : std::string("some are in no chunk"));
  }
  return "";
}

std::string chunk_tiling_problem(const EntryInfo& entry) {
  const Box whole{std::vector<int64_t>(entry.shape.size(), 0), entry.shape};
  std::vector<Box> boxes;
  for (const auto& c : entry.chunks) boxes.push_back(Box{c.offsets, c.sizes});
  return describe(check_tiling(whole, boxes), whole, [&](size_t i) {
    return "chunk '" + entry.chunks[i].name + "' (" + box_string(boxes[i]) + ")";
  });
}

}  // namespace fsdpp::checkpoint::detail
