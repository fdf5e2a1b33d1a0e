#pragma once
// Applying an auto-wrap policy: bottom-up, replacing selected container elements by units.
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <fsdpp/fully_shard_options.h>

namespace fsdpp::detail {

// Parameters of `module` (each tensor once, in named_parameters order) that no FSDP unit
// inside it shards.
std::vector<std::pair<std::string, at::Tensor>> unwrapped_parameters(const torch::nn::Module& module);

// Makes units (with `options`, minus the policy) of the submodules of `module` that `policy`
// selects, innermost first. `module` itself is not wrapped.
void apply_auto_wrap_policy(torch::nn::Module& module, const AutoWrapPolicy& policy, const FullyShardOptions& options);

}  // namespace fsdpp::detail
