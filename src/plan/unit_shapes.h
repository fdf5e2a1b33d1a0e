#pragma once
// The parameters of each FSDP unit of a transformer (the root: embeddings, final norm, output
// projection; then one unit per block), on one TP rank, and how fully_shard pads and shards
// them: each parameter's dim 0 in torch.chunk's rows per rank (ceil(dim0 / N)), a rank's padded
// chunks side by side in its flat shard (src/fsdp/unit_flat_layout.h).
#include <cstdint>
#include <string>
#include <vector>

#include <fsdpp/plan.h>

namespace fsdpp::plan::detail {

struct ParamShape {
  std::string name;
  int64_t dim0 = 0, row_numel = 1;
  int64_t numel() const { return dim0 * row_numel; }
};

// [0] the root, [1 + i] block i.
std::vector<std::vector<ParamShape>> unit_params(const ModelShape& model, int64_t tensor_parallel);

// Sizes of one unit sharded over `shard_group` ranks, as seen by `rank`.
UnitPlan shard_unit(const std::string& name, const std::vector<ParamShape>& params, int64_t shard_group, int64_t rank);

// Checks the layout makes sense (degrees divide the world, the rank is in the shard group).
void check_layout(const ParallelLayout& layout);
// Checks the shape and layout make sense (heads divide dim, degrees divide the world, ...):
// throws fsdpp::Error naming the offending value.
void check_shape_and_layout(const ModelShape& model, const ParallelLayout& layout);

}  // namespace fsdpp::plan::detail
