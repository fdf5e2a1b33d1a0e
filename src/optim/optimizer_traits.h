#pragma once
// One row per optimizer that named optimizer state dicts understand: its per-parameter state as
// PyTorch-named tensor entries and a step. Rows are built from fsdpp::OptimizerTraits<O>, so the
// Options / ParamState types of an optimizer are stated once, for ZeRO and state dicts alike.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace fsdpp::detail {

struct OptimizerStateTraits {
  std::vector<std::string> entries;   // tensor entries under PyTorch's (and libtorch's archive) names
  std::vector<std::string> required;  // the entries a parameter's state cannot do without
  bool has_step = false;              // whether "step" is an entry too
  std::function<bool(const torch::optim::Optimizer&)> matches;
  // A state's tensors in `entries` order (undefined where the optimizer made none), its step.
  std::function<std::vector<at::Tensor>(const torch::optim::OptimizerParamState&)> tensors;
  std::function<int64_t(const torch::optim::OptimizerParamState&)> step;
  // The state holding `tensors` (in `entries` order; undefined ones stay unset) and `step`.
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const std::vector<at::Tensor>& tensors, int64_t step)>
      make;
  // The tensors the first step would create for `param` under `options`; empty when that step
  // creates no state (SGD without momentum).
  std::function<std::vector<at::Tensor>(const torch::optim::OptimizerOptions& options, const at::Tensor& param)>
      initial;
};

// The row for `optim`'s type; throws naming the type for an optimizer without one.
const OptimizerStateTraits& optimizer_state_traits(const torch::optim::Optimizer& optim);

}  // namespace fsdpp::detail
