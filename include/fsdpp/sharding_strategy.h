#pragma once
// FSDP1's ShardingStrategy: how a unit spreads its parameters over the ranks.
namespace fsdpp {

enum class ShardingStrategy {
  // Parameters, gradients and optimizer state sharded over the group; parameters regathered for
  // backward (reshard_after_forward as set, true by default).
  FULL_SHARD,
  // As FULL_SHARD but the gathered parameters stay from forward to backward
  // (reshard_after_forward(false)).
  SHARD_GRAD_OP,
  // Nothing sharded: every rank holds the whole parameters and gradients are all-reduced, as
  // DistributedDataParallel does (HSDP with shard groups of one rank).
  NO_SHARD,
  // HSDP: sharded within each node (LOCAL_WORLD_SIZE consecutive ranks) and replicated across
  // nodes; a 2-D mesh (replicate, shard) says it explicitly.
  HYBRID_SHARD,
};

const char* to_string(ShardingStrategy s);

}  // namespace fsdpp
