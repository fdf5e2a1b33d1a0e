// FSDP x tensor parallelism on one parameter (model/parameter_placement.h).
#include "model/parameter_placement.h"

#include <vector>

#include <fsdpp/error.h>
#include <fsdpp/tensor_parallel.h>

#include "comm/flattened_mesh.h"
#include "common/error_text.h"

namespace fsdpp::detail {
namespace {

// A 2-D parameter's layout: the TP Shard over tp, then FSDP's Shard over dp of each TP-local part
// (every tp rank's FSDP unit shards its own part), as the block each rank of the (dp, tp) mesh
// holds, over the mesh's group. Under HSDP, dp is the shard group: each replica's mesh has its
// own group and the same blocks (a checkpoint writes each once).
TensorLayout two_d_layout(const TensorLayout& tp, const TensorLayout& fsdp, const FlattenedMesh& mesh) {
  const ProcessGroup& group = mesh.group;
  const std::vector<int>& grid = mesh.grid;
  const int t = tp.process_group().size(), d = fsdp.process_group().size();
  const int64_t tp_dim = tp.placements().front().dim(), fsdp_dim = fsdp.placements().front().dim();
  std::vector<ShardMetadata> blocks(group.size());
  for (int j = 0; j < t; ++j) {
    const TensorLayout part(tp.local_shape(j), fsdp.placements().front(), fsdp.process_group());
    for (int i = 0; i < d; ++i) {
      const int rank = group.group_rank(grid[static_cast<size_t>(i) * t + j]);
      ShardMetadata& b = blocks[rank];
      b.placement = rank;
      b.shard_offsets.assign(tp.global_shape().size(), 0);
      b.shard_offsets[tp_dim] = tp.local_offset(j);
      b.shard_sizes = part.local_shape(i);
      b.shard_offsets[fsdp_dim] += part.local_offset(i);
    }
  }
  return TensorLayout(tp.global_shape(), {fsdp.placements().front(), tp.placements().front()}, group, std::move(blocks));
}

}  // namespace

ParameterPlacements parameter_placements(torch::nn::Module& model) {
  ParameterPlacements out;
  for (const auto& m : model.modules(/*include_self=*/true))
    if (auto* unit = dynamic_cast<FSDPModule*>(m.get()))
      for (auto& p : unit->sharded_parameters()) {
        ParameterPlacement& placement = out[p.param.unsafeGetTensorImpl()];
        if (placement.sharded) continue;  // the first unit found keeps it
        placement.sharded = p;
        placement.unit = unit;
      }
  for (const auto& p : tensor_parallel_parameters(model)) {
    ParameterPlacement& placement = out[p.param.unsafeGetTensorImpl()];
    if (!placement.tp_layout) placement.tp_layout = p.layout;
  }
  return out;
}

ParameterPlacement placement_of(const at::Tensor& param, const ParameterPlacements& placements) {
  auto it = placements.find(param.unsafeGetTensorImpl());
  return it == placements.end() ? ParameterPlacement{} : it->second;
}

int64_t global_numel(const at::Tensor& param, const ParameterPlacements& placements) {
  auto it = placements.find(param.unsafeGetTensorImpl());
  if (it == placements.end()) return param.numel();
  const ParameterPlacement& p = it->second;
  if (p.tp_layout) return p.tp_layout->numel();
  if (p.sharded) return p.sharded->layout.numel();
  return param.numel();
}

std::optional<TensorLayout> composed_layout(const ParameterPlacement& placement, const std::string& key) {
  const bool tp_shard = placement.tp_layout && placement.tp_layout->placements().front().is_shard();
  if (tp_shard && placement.sharded) {
    const TensorLayout &fsdp = placement.sharded->layout, &tp = *placement.tp_layout;
    const ProcessGroup &dp = fsdp.process_group(), &tp_group = tp.process_group();
    std::shared_ptr<const FlattenedMesh> mesh;
    try {
      mesh = flattened_mesh(dp, tp_group);
    } catch (const Error& err) {
      throw Error("'" + key + "' is 2-D (FSDP over " + dp.name() + " of a TP part over " + tp_group.name() +
                  "): " + without_prefix(err.what()));
    }
    return two_d_layout(tp, fsdp, *mesh);
  }
  if (placement.sharded) return placement.sharded->layout;
  if (tp_shard) return placement.tp_layout;
  return std::nullopt;
}

}  // namespace fsdpp::detail
