#pragma once
// The process groups of one FSDP unit: the group its parameters are sharded across and, under
// HSDP (a 2-D mesh, HYBRID_SHARD or NO_SHARD), the group its reduced gradient shards are
// all-reduced across. Resolved once from fully_shard's options.
#include <string>

#include <fsdpp/process_group.h>

namespace fsdpp {
struct FullyShardOptions;
}

namespace fsdpp::detail {

struct UnitGroups {
  ProcessGroup shard;
  ProcessGroup replicate;  // empty when nothing is replicated

  bool replicated() const { return replicate.defined() && replicate.size() > 1; }
};

// Throws naming `unit` for a mesh of more than two dimensions, a mesh and a process group that
// disagree, a strategy that contradicts the mesh, or HYBRID_SHARD without a node size dividing
// the group. Collective over the group the first time a strategy needs subgroups.
UnitGroups unit_groups(const FullyShardOptions& options, const std::string& unit);

}  // namespace fsdpp::detail
