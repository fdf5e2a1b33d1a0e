#pragma once
// Private to the state dicts: a model's parameters and buffers under their plain keys (the
// keys of the unwrapped model), each with the FSDP unit that shards it, if any.
#include <optional>
#include <unordered_map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <fsdpp/fully_shard.h>
#include <fsdpp/tensor_layout.h>

namespace fsdpp::detail {

// A parameter or buffer of the model under its plain key.
struct ModelEntry {
  std::string key;
  at::Tensor tensor;  // the module's own tensor (for an FSDP parameter: its shard at rest)
  bool is_buffer = false;
  std::optional<ShardedParameter> sharded;  // set when an FSDP unit shards it
  FSDPModule* unit = nullptr;
  // Set for a tensor-parallel parameter: its global shape and placement over the TP group. An
  // FSDP unit then shards (and gathers) the TP-local part, whose shape is this layout's local one.
  std::optional<TensorLayout> tp_layout;
  // How its value lies over the ranks in SHARDED state dicts and optimizer state: the unit's
  // layout (FSDP), the TP layout (a TP Shard without FSDP), both composed as blocks over the
  // group of the (dp, tp) mesh's ranks (2-D: a TP Shard, then FSDP over dp; under HSDP dp is the
  // shard group, each replica's mesh its own group). Unset: whole on every rank (a TP
  // Replicate parameter is the FSDP layout's, or whole, as its tp ranks hold the same).
  std::optional<TensorLayout> layout;
};

// An FSDP unit that shards parameters, with the key of its LOCAL flat parameter
// ("<plain path>._flat_param").
struct UnitEntry {
  std::string flat_key;
  FSDPModule* unit = nullptr;
  size_t first_entry = 0;  // entries before this one come before the unit in module order
};

struct ModelLayout {
  std::vector<ModelEntry> entries;  // module order: a module's parameters, buffers, children
  std::vector<UnitEntry> units;     // units with parameters, module order
};

// Collective the first time a 2-D (FSDP x TP) model's (dp, tp) pair of groups is seen in this
// process (detail::flattened_mesh: an all-gather over dp to learn which rank holds which block,
// then the group of the mesh's ranks); no communication after. Every rank of the model calls it alike.
ModelLayout collect_layout(torch::nn::Module& model);

// Each FSDP parameter's full value by its TensorImpl (collective over each unit's group).
std::unordered_map<const c10::TensorImpl*, at::Tensor> gather_full_params(const ModelLayout& layout);

}  // namespace fsdpp::detail
