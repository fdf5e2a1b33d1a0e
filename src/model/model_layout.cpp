// ModelLayout: the model's entries under plain keys, and the TensorLayout each one's value lies
// over, composed from FSDP's and tensor parallelism's public API.
#include <fsdpp/model_layout.h>

#include <unordered_map>

#include <ATen/ATen.h>

#include <fsdpp/error.h>
#include <fsdpp/tensor_parallel.h>

#include "comm/flattened_mesh.h"
#include "common/error_text.h"

namespace fsdpp {
namespace {

using Entry = ModelLayout::Entry;

// The wrappers' own segments, which state dict keys leave out (as PyTorch's FSDP and
// CheckpointWrapper state-dict hooks do), so a plain model loads them and vice versa.
bool is_wrapper_segment(const std::string& name) {
  return name == "_fsdp_wrapped_module" || name == "_checkpoint_wrapped_module";
}

struct Owner {
  ShardedParameter param;
  FSDPModule* unit;
};
using Owners = std::unordered_map<const c10::TensorImpl*, Owner>;
using TPLayouts = std::unordered_map<const c10::TensorImpl*, TensorLayout>;

void visit_module(torch::nn::Module& m, const std::string& prefix, const Owners& owners, const TPLayouts& tp,
                  ModelLayout& out) {
  if (auto* unit = dynamic_cast<FSDPModule*>(&m))
    if (!unit->sharded_parameter_names().empty()) out.units.push_back({prefix + "_flat_param", unit, out.entries.size()});
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    Entry e{prefix + item.key(), item.value(), false, std::nullopt, nullptr, std::nullopt, std::nullopt};
    auto it = owners.find(item.value().unsafeGetTensorImpl());
    if (it != owners.end()) {
      e.sharded = it->second.param;
      e.unit = it->second.unit;
    }
    if (auto t = tp.find(item.value().unsafeGetTensorImpl()); t != tp.end()) e.tp_layout = t->second;
    out.entries.push_back(std::move(e));
  }
  for (const auto& item : m.named_buffers(/*recurse=*/false))
    out.entries.push_back({prefix + item.key(), item.value(), true, std::nullopt, nullptr, std::nullopt, std::nullopt});
  for (const auto& child : m.named_children())
    visit_module(*child.value(), is_wrapper_segment(child.key()) ? prefix : prefix + child.key() + ".", owners, tp,
                 out);
}

// A 2-D entry's layout: the TP Shard over tp, then FSDP's Shard over dp of each TP-local part
// (every tp rank's FSDP unit shards its own part), as the block each rank of the (dp, tp) mesh
// holds, over the mesh's group. Under HSDP, dp is the shard group: each replica's mesh has its
// own group and the same blocks (a checkpoint writes each once).
TensorLayout two_d_layout(const Entry& e, const detail::FlattenedMesh& mesh) {
  const TensorLayout& tp = *e.tp_layout;
  const TensorLayout& fsdp = e.sharded->layout;
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

// Each entry's layout (Entry::layout); 2-D ones lie over their (dp, tp) mesh, learnt (and its
// group made) by the first layout of any model on that pair of groups, cached after.
void set_layouts(ModelLayout& layout) {
  for (auto& e : layout.entries) {
    const bool tp_shard = e.tp_layout && e.tp_layout->placements().front().is_shard();
    if (tp_shard && e.sharded) {
      const ProcessGroup &dp = e.sharded->layout.process_group(), &tp = e.tp_layout->process_group();
      std::shared_ptr<const detail::FlattenedMesh> mesh;
      try {
        mesh = detail::flattened_mesh(dp, tp);
      } catch (const Error& err) {
        throw Error("'" + e.key + "' is 2-D (FSDP over " + dp.name() + " of a TP part over " + tp.name() +
                    "): " + detail::without_prefix(err.what()));
      }
      e.layout = two_d_layout(e, *mesh);
    } else if (e.sharded) {
      e.layout = e.sharded->layout;
    } else if (tp_shard) {
      e.layout = e.tp_layout;
    }
  }
}

}  // namespace

ModelLayout::ModelLayout(torch::nn::Module& model) {
  Owners owners;
  for (const auto& m : model.modules(/*include_self=*/true))
    if (auto* unit = dynamic_cast<FSDPModule*>(m.get()))
      for (auto& p : unit->sharded_parameters()) owners.emplace(p.param.unsafeGetTensorImpl(), Owner{p, unit});
  // TP parameters by TensorImpl: FSDP keeps a parameter's TensorImpl, so this finds them under
  // units too.
  TPLayouts tp;
  for (const auto& p : tensor_parallel_parameters(model)) tp.emplace(p.param.unsafeGetTensorImpl(), p.layout);
  visit_module(model, "", owners, tp, *this);
  set_layouts(*this);
}

}  // namespace fsdpp
