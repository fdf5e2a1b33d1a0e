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

namespace fsdpp::detail {

// A parameter or buffer of the model under its plain key.
struct ModelEntry {
  std::string key;
  at::Tensor tensor;  // the module's own tensor (for an FSDP parameter: its shard at rest)
  bool is_buffer = false;
  std::optional<ShardedParameter> sharded;  // set when an FSDP unit shards it
  FSDPModule* unit = nullptr;
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

ModelLayout collect_layout(torch::nn::Module& model);

// Each FSDP parameter's full value by its TensorImpl (collective over each unit's group).
std::unordered_map<const c10::TensorImpl*, at::Tensor> gather_full_params(const ModelLayout& layout);

}  // namespace fsdpp::detail
