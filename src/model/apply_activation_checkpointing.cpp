#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/wrap_policy.h>

#include "activation_checkpointing/any_checkpoint_wrapper.h"
#include "activation_checkpointing/checkpointed_any_call.h"
#include "model/parameter_placement.h"
#include "nn/replace_modules.h"

namespace fsdpp {
namespace detail {

AnyCheckpointWrapperImpl::AnyCheckpointWrapperImpl(torch::nn::AnyModule module) : module_(std::move(module)) {
  register_module("_checkpoint_wrapped_module", module_.ptr());
}

torch::nn::AnyValue AnyCheckpointWrapperImpl::forward(std::vector<torch::nn::AnyValue> arguments) {
  return checkpointed_any_call(module_, std::move(arguments), "checkpoint wrapper of " + module_.ptr()->name());
}

}  // namespace detail

namespace {

// The policy sees each parameter's global element count (detail::global_numel), so every rank
// selects the same modules (a rank's own part differs with uneven splits, and a checkpoint on
// some ranks only would recompute collectives on those ranks only).
int64_t policy_numel(const torch::nn::Module& module, const detail::ParameterPlacements& placements) {
  int64_t numel = 0;
  for (const auto& p : module.parameters()) numel += detail::global_numel(p, placements);
  return numel;
}

}  // namespace

int apply_activation_checkpointing(torch::nn::Module& model, const std::shared_ptr<const AutoWrapPolicy>& policy) {
  if (!policy || !policy->should_wrap) throw Error("apply_activation_checkpointing: the policy is null or selects nothing");
  auto is_wrapper = [](const torch::nn::Module& m) {
    return m.named_children().contains("_checkpoint_wrapped_module");
  };
  const detail::ParameterPlacements placements = detail::parameter_placements(model);
  detail::ModuleReplacement r;
  r.descend = [&](const torch::nn::Module& m) { return !is_wrapper(m); };
  r.selects = [&](const std::shared_ptr<torch::nn::Module>& m) {
    if (is_wrapper(*m) || dynamic_cast<FSDPModule*>(m.get())) return false;
    return policy->should_wrap(*m, policy_numel(*m, placements));
  };
  // A unit's wrapped module is called by the unit, not by a container, so it cannot be
  // replaced: the unit checkpoints its call instead (inside its gather, as FSDP(wrapper(m))).
  int units = 0;
  auto checkpoint_unit = [&](torch::nn::Module& m) {
    auto* unit = dynamic_cast<FSDPModule*>(&m);
    if (!unit || unit->checkpoints_wrapped_module() || is_wrapper(*unit->wrapped_module())) return;
    if (!policy->should_wrap(*unit->wrapped_module(), policy_numel(*unit->wrapped_module(), placements))) return;
    unit->set_checkpoint_wrapped_module(true);
    ++units;
  };
  checkpoint_unit(model);
  for (const auto& m : model.modules(/*include_self=*/false)) checkpoint_unit(*m);
  if (policy->make_checkpoint_wrapper) r.typed = policy->make_checkpoint_wrapper;
  r.type_blind = [](const torch::nn::AnyModule& element) {
    return torch::nn::AnyModule(std::make_shared<detail::AnyCheckpointWrapperImpl>(element));
  };
  return units + detail::replace_modules(model, r);
}

}  // namespace fsdpp
