#include "fsdp/unit_groups.h"

#include <fsdpp/error.h>
#include <fsdpp/fully_shard.h>

#include "comm/process_group_impl.h"

namespace fsdpp {

namespace detail {
namespace {

ProcessGroup one_dimensional_group(const FullyShardOptions& options, const std::string& unit) {
  if (!options.mesh().defined()) return options.process_group().defined() ? options.process_group() : default_group();
  ProcessGroup mesh_group = options.mesh().get_group();
  if (options.process_group().defined() && options.process_group().ranks() != mesh_group.ranks())
    throw Error("fully_shard of " + unit + ": the mesh's group (" + mesh_group.name() + ") and process_group (" +
                options.process_group().name() + ") differ; pass one of them");
  return mesh_group;
}

UnitGroups from_2d_mesh(const FullyShardOptions& options, const std::string& unit) {
  const DeviceMesh& mesh = options.mesh();
  const auto strategy = options.sharding_strategy();
  if (strategy && *strategy != ShardingStrategy::HYBRID_SHARD)
    throw Error("fully_shard of " + unit + ": sharding_strategy " + to_string(*strategy) +
                " shards across one dimension, but the mesh has 2 (replicate, shard); pass a 1-D mesh or HYBRID_SHARD");
  if (options.process_group().defined())
    throw Error("fully_shard of " + unit + ": pass a 2-D mesh or a process_group, not both");
  return {mesh.get_group(1), mesh.get_group(0)};
}

// HYBRID_SHARD without a mesh: nodes of LOCAL_WORLD_SIZE consecutive ranks (the launchers'
// numbering), as FSDP1 makes its intra- and inter-node groups.
UnitGroups hybrid_by_node(const ProcessGroup& group, const std::string& unit) {
  const int node = get_local_world_size();
  if (node < 1 || group.size() % node != 0)
    throw Error("fully_shard of " + unit + ": HYBRID_SHARD shards within nodes of LOCAL_WORLD_SIZE = " +
                std::to_string(node) + " ranks, which does not divide group " + group.name() + " of " +
                std::to_string(group.size()) + " ranks; set LOCAL_WORLD_SIZE or pass a 2-D mesh (replicate, shard)");
  return {consecutive_subgroup(group, node), strided_subgroup(group, node)};
}

}  // namespace

UnitGroups unit_groups(const FullyShardOptions& options, const std::string& unit) {
  if (options.mesh().defined() && options.mesh().ndim() == 2) return from_2d_mesh(options, unit);
  if (options.mesh().defined() && options.mesh().ndim() != 1)
    throw Error("fully_shard of " + unit + ": a " + std::to_string(options.mesh().ndim()) +
                "-D mesh is not supported; pass a 1-D mesh (shard) or a 2-D mesh (replicate, shard)");
  ProcessGroup group = one_dimensional_group(options, unit);
  switch (options.sharding_strategy().value_or(ShardingStrategy::FULL_SHARD)) {
    case ShardingStrategy::NO_SHARD: return {consecutive_subgroup(group, 1), group};
    case ShardingStrategy::HYBRID_SHARD:
      if (options.mesh().defined())
        throw Error("fully_shard of " + unit + ": HYBRID_SHARD needs a 2-D mesh (replicate, shard), got a 1-D mesh");
      return hybrid_by_node(group, unit);
    default: return {group, ProcessGroup()};
  }
}

}  // namespace detail
}  // namespace fsdpp
