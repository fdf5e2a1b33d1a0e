#include "fsdp/any_module_unit.h"

#include <optional>
#include <utility>

#include "activation_checkpointing/checkpointed_any_call.h"
#include "nn/any_module_call.h"

namespace fsdpp::detail {

AnyModuleUnitImpl::AnyModuleUnitImpl(torch::nn::AnyModule module, FullyShardOptions options)
    : FSDPModule(module.ptr(), std::move(options)), module_(std::move(module)) {}

torch::nn::AnyValue AnyModuleUnitImpl::forward(std::vector<torch::nn::AnyValue> arguments) {
  std::vector<at::Tensor*> inputs;
  for (auto& a : arguments)
    if (auto* t = a.try_get<at::Tensor>()) inputs.push_back(t);
  std::optional<torch::nn::AnyValue> output;
  forward_steps(inputs, [&] {
    const std::string who = "FSDP unit of " + module_.ptr()->name();
    output.emplace(checkpoints_wrapped_module() ? checkpointed_any_call(module_, arguments, who)
                                                : call_any_module(module_, arguments, who));
    auto* t = output->try_get<at::Tensor>();
    return t ? std::vector<at::Tensor*>{t} : std::vector<at::Tensor*>{};
  });
  return std::move(*output);
}

}  // namespace fsdpp::detail
