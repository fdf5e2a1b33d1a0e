#pragma once
// Private helpers of the state dicts: a model's entries under their plain keys, which FSDP
// parameter (and unit) each one is, and the dim-0 row layout of an FSDP parameter as shards.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <fsdpp/fully_shard.h>
#include <fsdpp/process_group.h>
#include <fsdpp/sharded_tensor.h>

#include "fsdp/fsdp_param.h"
#include "fsdp/fsdp_param_group.h"
#include "fsdp/fsdp_state.h"

namespace fsdpp::detail {

// A parameter or buffer of the model under its plain key.
struct ModelEntry {
  std::string key;
  at::Tensor tensor;  // the module's own tensor (for an FSDP parameter: its shard at rest)
  bool is_buffer = false;
  const FSDPParam* fsdp_param = nullptr;  // set when an FSDP unit shards it
  FSDPModule* unit = nullptr;
};

// An FSDP unit with the key of its LOCAL flat parameter ("<plain path>._flat_param").
struct UnitEntry {
  std::string flat_key;
  FSDPModule* unit = nullptr;
  size_t first_entry = 0;  // entries before this one come before the unit in module order
  const FSDPParamGroup& group() const { return *unit->fsdp_state()->param_group(); }
};

struct ModelLayout {
  std::vector<ModelEntry> entries;  // module order: a module's parameters, buffers, children
  std::vector<UnitEntry> units;     // units with parameters, module order
};

ModelLayout collect_layout(torch::nn::Module& model);

// The rank's rows of an FSDP parameter's full value, shaped as its shard (sharded_size of `rank`).
at::Tensor rows_of_full(const FSDPParam& p, const at::Tensor& full, int rank, int world_size);
// The shard shape of an FSDP parameter on `rank`.
std::vector<int64_t> sharded_size_of(const FSDPParam& p, int rank);
// Every rank's (non-empty) shard of an FSDP parameter of `world_size` ranks.
std::vector<ShardMetadata> row_shards(const FSDPParam& p, int world_size);
// A shard-shaped tensor of this rank (the parameter's rows, or optimizer state like it) as a
// ShardedTensor of the parameter's global shape. No communication.
ShardedTensor to_sharded(const FSDPParam& p, const at::Tensor& local, const ProcessGroup& group, bool copy);
// True when `st` places exactly the parameter's row shards on the same group ranks.
bool matches_row_layout(const ShardedTensor& st, const std::vector<ShardMetadata>& expected, int world_size);
// This rank's local shard of `st` with the given metadata (matches_row_layout was true).
at::Tensor local_shard_with(const ShardedTensor& st, const ShardMetadata& m);
// This rank's shard-shaped rows of `st` (the parameter's global shape): the matching local shard,
// or, when `st` is sharded differently, its full_tensor() (collective over st's group) sliced.
at::Tensor local_rows_from(const ShardedTensor& st, const FSDPParam& p, const ProcessGroup& group);

// Each FSDP parameter's full value, all-gathered per unit (collective over the unit's group).
std::unordered_map<const FSDPParam*, at::Tensor> gather_full_params(const ModelLayout& layout);


}  // namespace fsdpp::detail
