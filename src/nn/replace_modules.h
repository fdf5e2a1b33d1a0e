#pragma once
// Replacing selected submodules in the containers that call them (libtorch has no forward hooks,
// so a wrapper must sit where its caller calls it): what FSDP's auto-wrap and activation
// checkpointing's apply_activation_checkpointing share.
#include <functional>
#include <memory>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

namespace fsdpp::detail {

struct ModuleReplacement {
  // Whether the walk looks inside a child (bottom-up: children are visited before their parent).
  std::function<bool(const torch::nn::Module&)> descend;
  // Whether a container element is to be replaced.
  std::function<bool(const std::shared_ptr<torch::nn::Module>&)> selects;
  // The typed replacement of a selected module, or an empty AnyModule when there is none.
  std::function<torch::nn::AnyModule(const std::shared_ptr<torch::nn::Module>&)> typed;
  // The type-blind replacement of a selected Sequential element (through its AnyModule), used
  // when there is no typed one; may be empty.
  std::function<torch::nn::AnyModule(const torch::nn::AnyModule&)> type_blind;
};

// Replaces, bottom-up below `module` (not `module` itself), each selected element of a
// torch::nn::Sequential (typed, else type-blind) and of a ModuleList (typed only). Returns how
// many it replaced.
int replace_modules(torch::nn::Module& module, const ModuleReplacement& replacement);

}  // namespace fsdpp::detail
