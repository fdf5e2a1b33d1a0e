#include "activation_checkpointing/checkpointed_any_call.h"

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/error.h>

#include "nn/any_module_call.h"

namespace fsdpp::detail {

torch::nn::AnyValue checkpointed_any_call(torch::nn::AnyModule module, std::vector<torch::nn::AnyValue> arguments,
                                          const std::string& who) {
  std::vector<at::Tensor> tensors;
  for (auto& a : arguments)
    if (auto* t = a.try_get<at::Tensor>()) tensors.push_back(*t);
  if (tensors.empty()) throw Error(who + ": forward was given no tensor, so there is nothing to recompute from");
  // Kept until backward's recomputation: the module (shared, not cloned) and the arguments.
  auto run = [module, arguments, who](const std::vector<at::Tensor>& values) mutable {
    std::vector<torch::nn::AnyValue> call = arguments;
    size_t next = 0;
    for (auto& a : call)
      if (a.try_get<at::Tensor>()) a = torch::nn::AnyValue(values[next++]);
    torch::nn::AnyValue out = call_any_module(module, call, who);
    auto* t = out.try_get<at::Tensor>();
    if (!t) throw Error(who + ": a type-blind checkpointed call needs a forward that returns a tensor");
    return std::vector<at::Tensor>{*t};
  };
  return torch::nn::AnyValue(checkpointed_call(tensors, run).at(0));
}

}  // namespace fsdpp::detail
