#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/wrap_policy.h>

#include "activation_checkpointing/any_checkpoint_wrapper.h"
#include "nn/any_module_call.h"
#include "nn/replace_modules.h"

namespace fsdpp {
namespace detail {

AnyCheckpointWrapperImpl::AnyCheckpointWrapperImpl(torch::nn::AnyModule module) : module_(std::move(module)) {
  register_module("_checkpoint_wrapped_module", module_.ptr());
}

torch::nn::AnyValue AnyCheckpointWrapperImpl::forward(std::vector<torch::nn::AnyValue> arguments) {
  const std::string who = "checkpoint wrapper of " + module_.ptr()->name();
  std::vector<at::Tensor> tensors;
  for (auto& a : arguments)
    if (auto* t = a.try_get<at::Tensor>()) tensors.push_back(*t);
  if (tensors.empty()) throw Error(who + ": forward was given no tensor, so there is nothing to recompute from");
  auto run = [this, arguments, who](const std::vector<at::Tensor>& values) {
    std::vector<torch::nn::AnyValue> call = arguments;
    size_t next = 0;
    for (auto& a : call)
      if (a.try_get<at::Tensor>()) a = torch::nn::AnyValue(values[next++]);
    torch::nn::AnyValue out = call_any_module(module_, call, who);
    auto* t = out.try_get<at::Tensor>();
    if (!t) throw Error(who + ": a type-blind checkpoint wrapper needs a forward that returns a tensor");
    return std::vector<at::Tensor>{*t};
  };
  return torch::nn::AnyValue(checkpointed_call(tensors, run).at(0));
}

}  // namespace detail

int apply_activation_checkpointing(torch::nn::Module& model, const std::shared_ptr<const AutoWrapPolicy>& policy) {
  if (!policy || !policy->should_wrap) throw Error("apply_activation_checkpointing: the policy is null or selects nothing");
  auto is_wrapper = [](const torch::nn::Module& m) {
    return m.named_children().contains("_checkpoint_wrapped_module");
  };
  detail::ModuleReplacement r;
  r.descend = [&](const torch::nn::Module& m) { return !is_wrapper(m); };
  r.selects = [&](const std::shared_ptr<torch::nn::Module>& m) {
    if (is_wrapper(*m) || dynamic_cast<FSDPModule*>(m.get())) return false;
    int64_t numel = 0;
    for (const auto& p : m->parameters()) numel += p.numel();
    return policy->should_wrap(*m, numel);
  };
  if (policy->make_checkpoint_wrapper) r.typed = policy->make_checkpoint_wrapper;
  r.type_blind = [](const torch::nn::AnyModule& element) {
    return torch::nn::AnyModule(std::make_shared<detail::AnyCheckpointWrapperImpl>(element));
  };
  return detail::replace_modules(model, r);
}

}  // namespace fsdpp
