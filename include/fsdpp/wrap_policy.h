#pragma once
// Auto-wrap policies (FSDP1's auto_wrap_policy; the AutoWrapPolicy type is in
// <fsdpp/fully_shard_options.h>): which submodules of a module being wrapped become FSDP units
// of their own, without editing the model's class.
//
//   auto opts = fsdpp::FullyShardOptions().auto_wrap_policy(fsdpp::ModuleWrapPolicy<BlockImpl>());
//   fsdpp::FullyShardedDataParallel<torch::nn::SequentialImpl> model(net, opts);   // every Block a unit
//
// libtorch has no forward hooks, so a unit must sit where its callers call it: a policy wraps
// the selected modules held in a torch::nn::Sequential (its elements are AnyModules, called by
// the Sequential) and, for ModuleWrapPolicy, in a torch::nn::ModuleList (the element becomes a
// FullyShardedDataParallelImpl<T>; callers reach it with ->as<FullyShardedDataParallelImpl<T>>()).
// A selected module held any other way (a typed member of a user class) stays in its parent's
// unit; make it a unit with the documented one-line change instead.
#include <cstdint>
#include <functional>
#include <memory>

#include <torch/nn/modules/container/any.h>

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/fully_shard_options.h>

namespace fsdpp {

// Wraps every submodule whose type is one of Ts (PyTorch's ModuleWrapPolicy({Block})).
template <typename... Ts>
std::shared_ptr<const AutoWrapPolicy> ModuleWrapPolicy() {
  static_assert(sizeof...(Ts) > 0, "ModuleWrapPolicy needs at least one module type");
  auto policy = std::make_shared<AutoWrapPolicy>();
  policy->should_wrap = [](const torch::nn::Module& m, int64_t) {
    return ((dynamic_cast<const Ts*>(&m) != nullptr) || ...);
  };
  policy->make_unit = [](const std::shared_ptr<torch::nn::Module>& m, const FullyShardOptions& options) {
    torch::nn::AnyModule unit;
    auto try_type = [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      if (unit.is_empty())
        if (auto typed = std::dynamic_pointer_cast<T>(m))
          unit = torch::nn::AnyModule(std::make_shared<FullyShardedDataParallelImpl<T>>(typed, options));
    };
    (try_type(static_cast<Ts*>(nullptr)), ...);
    return unit;
  };
  policy->make_checkpoint_wrapper = [](const std::shared_ptr<torch::nn::Module>& m) {
    torch::nn::AnyModule wrapper;
    auto try_type = [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      if (wrapper.is_empty())
        if (auto typed = std::dynamic_pointer_cast<T>(m))
          wrapper = torch::nn::AnyModule(std::make_shared<CheckpointWrapperImpl<T>>(typed));
    };
    (try_type(static_cast<Ts*>(nullptr)), ...);
    return wrapper;
  };
  return policy;
}

// Wraps every Sequential element holding at least min_num_params parameters that no inner
// unit shards (PyTorch's size_based_auto_wrap_policy).
std::shared_ptr<const AutoWrapPolicy> SizeBasedAutoWrapPolicy(int64_t min_num_params);

// PyTorch's apply_activation_checkpointing(model, auto_wrap_policy=...): replaces every
// submodule of `model` the policy selects (ModuleWrapPolicy,
// SizeBasedAutoWrapPolicy, or a custom AutoWrapPolicy) by its checkpoint wrapper, where the container
// holding it can take the wrapper: an element of a torch::nn::Sequential (any selected module;
// the Sequential passes its values through, up to 6 arguments, and the element must return a
// tensor) or of a ModuleList (ModuleWrapPolicy's types only; callers reach it as
// `->as<fsdpp::CheckpointWrapperImpl<T>>()`). Inside FSDP units too. A module an FSDP unit wraps
// is called by the unit, so it is not replaced: the unit checkpoints its call instead (inside its
// gather; FSDPModule::set_checkpoint_wrapped_module), the policy counting its parameters at
// their global sizes. Returns how many it wrapped, such units included.
int apply_activation_checkpointing(torch::nn::Module& model, const std::shared_ptr<const AutoWrapPolicy>& policy);

}  // namespace fsdpp
