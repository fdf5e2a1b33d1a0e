#pragma once
// What both optimizer state-dict layouts (indexed for ZeRO, named for FSDP models) read from and
// write to a libtorch optimizer: a parameter's state, and group options as serialized bytes.
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace fsdpp::detail {

// The state `optim` keeps for `param`, or null before its first step.
const torch::optim::OptimizerParamState* find_param_state(const torch::optim::Optimizer& optim,
                                                          const at::Tensor& param);

// Options as libtorch's serialized archive bytes, and such bytes read into a clone of
// `prototype` (throws c10::Error when they do not read as its type).
std::string options_to_bytes(const torch::optim::OptimizerOptions& options);
std::unique_ptr<torch::optim::OptimizerOptions> options_from_bytes(const torch::optim::OptimizerOptions& prototype,
                                                                   const std::string& bytes);

}  // namespace fsdpp::detail
