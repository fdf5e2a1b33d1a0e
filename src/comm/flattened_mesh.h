#pragma once
// The 2-D mesh two groups span (PyTorch's mesh["dp", "tp"]._flatten()), private to fsdpp: which
// global rank sits at each (outer, inner) coordinate, and the group of exactly those ranks. The
// state dicts lay a 2-D (FSDP over dp of a TP part over tp) parameter's blocks over it.
#include <memory>
#include <vector>

#include <fsdpp/process_group.h>

namespace fsdpp::detail {

struct FlattenedMesh {
  int outer_size = 0, inner_size = 0;
  // grid[i * inner_size + j]: the global rank at outer i, inner j.
  std::vector<int> grid;
  // The group of the grid's ranks (group ranks in ascending global order, not grid order).
  ProcessGroup group;
};

// The mesh of `outer` (e.g. dp) and, at each member of it, that member's `inner` group (e.g. tp).
// The first call for a given inner group is collective: an all-gather over `outer` of each
// member's inner ranks, then the mesh group's creation by its members alone (every rank of the
// mesh calls it alike; ranks outside it need not: other pipeline stages, other HSDP replicas).
// Cached on `outer` after: no communication. Throws naming both groups unless the inner groups
// of the outer members are disjoint and of one size (a mesh).
std::shared_ptr<const FlattenedMesh> flattened_mesh(const ProcessGroup& outer, const ProcessGroup& inner);

}  // namespace fsdpp::detail
