#pragma once
// What OptimizerStateDict reads from and writes to a libtorch optimizer, for ZeRO and state
// dicts alike: a parameter's state as named entries, and group options as serialized bytes.
#include <functional>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/serialize/output-archive.h>
#include <torch/optim/optimizer.h>

#include <fsdpp/state_dict_container.h>

namespace fsdpp::detail {

// The state `optim` keeps for `param`, or null before its first step.
const torch::optim::OptimizerParamState* find_param_state(const torch::optim::Optimizer& optim,
                                                          const at::Tensor& param);

// Options as libtorch's serialized archive bytes, and such bytes read into a clone of
// `prototype` (throws c10::Error when they do not read as its type).
std::string options_to_bytes(const torch::optim::OptimizerOptions& options);
std::unique_ptr<torch::optim::OptimizerOptions> options_from_bytes(const torch::optim::OptimizerOptions& prototype,
                                                                   const std::string& bytes);

// A parameter's state as entries under its serialized names: tensors as they are, numbers (the
// step) as 0-dim tensors. Works for any state type, so it needs no per-optimizer table.
StateDict param_state_entries(const torch::optim::OptimizerParamState& state);
// Entries written as a state archive: 0-dim int64 / double / bool tensors as plain numbers (what
// libtorch's states read back), the rest as tensors. Throws fsdpp::Error on a ShardedTensor.
void write_param_state(const StateDict& entries, torch::serialize::OutputArchive& archive);
// `fresh` filled from `entries`, its tensors on `device`; `check` sees every tensor first.
// Throws c10::Error when the entries do not read as its type.
std::unique_ptr<torch::optim::OptimizerParamState> param_state_from_entries(
    const StateDict& entries, std::unique_ptr<torch::optim::OptimizerParamState> fresh, c10::Device device,
    const std::function<void(const std::string& name, const at::Tensor& t)>& check);

}  // namespace fsdpp::detail
