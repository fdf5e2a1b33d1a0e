#pragma once
// FSDP x tensor parallelism on one parameter, decided here once: the FSDP unit that shards it
// and its tensor-parallel layout, and what follows from the pair: the element count of its whole
// value and the TensorLayout that value lies over (1-D FSDP or HSDP, TP, or 2-D: FSDP over dp of
// each TP-local part over tp). ModelLayout (model_layout.cpp) and apply_activation_checkpointing
// read it. Private to fsdpp.
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <fsdpp/fully_shard.h>
#include <fsdpp/tensor_layout.h>

namespace fsdpp::detail {

struct ParameterPlacement {
  // Set when an FSDP unit shards it, with that unit.
  std::optional<ShardedParameter> sharded;
  FSDPModule* unit = nullptr;
  // Set for a tensor-parallel parameter: its global shape and placement over the TP group. An
  // FSDP unit then shards (and gathers) the TP-local part.
  std::optional<TensorLayout> tp_layout;
};

// Every FSDP-sharded or tensor-parallel parameter of `model`, by TensorImpl (FSDP keeps a
// parameter's TensorImpl, so a TP parameter under a unit is found too). Local: no communication.
using ParameterPlacements = std::unordered_map<const c10::TensorImpl*, ParameterPlacement>;
ParameterPlacements parameter_placements(torch::nn::Module& model);

// The placement of `param` (empty when neither FSDP nor TP places it).
ParameterPlacement placement_of(const at::Tensor& param, const ParameterPlacements& placements);

// The element count of `param`'s whole value, the same on every rank: the TP global shape's (a
// 2-D parameter's too: its unit shards the TP-local part), else its unit's unsharded one, else
// the tensor's own. Local.
int64_t global_numel(const at::Tensor& param, const ParameterPlacements& placements);

// The layout the value of a parameter placed so lies over; unset: whole on every rank (a TP
// Replicate parameter without FSDP too). A 2-D one lies over the group of its (dp, tp) mesh's
// ranks, learnt (and that group made) by the first call of any model on that pair of groups,
// collectively, cached after (comm/flattened_mesh.h); its error names `key`.
std::optional<TensorLayout> composed_layout(const ParameterPlacement& placement, const std::string& key);

}  // namespace fsdpp::detail
