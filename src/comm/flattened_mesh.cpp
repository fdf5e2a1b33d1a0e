#include "comm/flattened_mesh.h"

#include <algorithm>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "comm/process_group_impl.h"

namespace fsdpp::detail {

std::shared_ptr<const FlattenedMesh> flattened_mesh(const ProcessGroup& outer, const ProcessGroup& inner) {
  const ProcessGroupImpl& o = outer.impl();
  std::lock_guard<std::mutex> lock(o.meshes_mutex);
  auto it = o.flattened_meshes.find(inner.ranks());
  if (it != o.flattened_meshes.end()) return it->second;
  if (!outer.is_member() || !inner.is_member())
    throw Error("flattened mesh of groups " + outer.name() + " and " + inner.name() + ": global rank " +
                std::to_string(o.global_rank) + " is not a member of both");
  auto mesh = std::make_shared<FlattenedMesh>();
  mesh->outer_size = outer.size();
  mesh->inner_size = inner.size();
  const int64_t t = inner.size();
  at::Tensor mine = at::empty({t}, at::kLong);
  for (int64_t j = 0; j < t; ++j) mine[j] = inner.ranks()[j];
  at::Tensor all = at::empty({outer.size() * t}, at::kLong);
  if (outer.size() > 1)
    all_gather_into_tensor(all, mine, outer);  // checks that every member's inner group has t ranks
  else
    all.copy_(mine);
  mesh->grid.assign(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
  std::vector<int> sorted = mesh->grid;
  std::sort(sorted.begin(), sorted.end());
  for (size_t k = 1; k < sorted.size(); ++k)
    if (sorted[k] == sorted[k - 1])
      throw Error("the groups " + outer.name() + " (" + std::to_string(outer.size()) + " ranks) and " + inner.name() +
                  " (" + std::to_string(t) + " ranks) span no mesh: global rank " + std::to_string(sorted[k]) +
                  " is in the inner groups of two members of " + outer.name());
  // Every rank of the mesh gets here for the same grid (its outer group's all-gather gives it).
  // A mesh of the whole default group is that group: no second set of connections and comm thread.
  const ProcessGroup world = default_group();
  std::vector<int> world_ranks = world.ranks();
  std::sort(world_ranks.begin(), world_ranks.end());
  mesh->group = sorted == world_ranks ? world : members_group(world, sorted);
  return o.flattened_meshes[inner.ranks()] = std::move(mesh);
}

}  // namespace fsdpp::detail
