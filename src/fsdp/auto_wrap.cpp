#include "fsdp/auto_wrap.h"

#include <unordered_set>

#include "fsdp/any_module_unit.h"
#include "fsdp/ignored_params.h"
#include "nn/replace_modules.h"

namespace fsdpp {
namespace detail {

std::vector<std::pair<std::string, at::Tensor>> unwrapped_parameters(const torch::nn::Module& module) {
  std::unordered_set<const c10::TensorImpl*> skip;
  for (const auto& m : module.modules())
    if (auto* f = dynamic_cast<FSDPModule*>(m.get()))
      for (const auto& p : f->parameters()) skip.insert(p.unsafeGetTensorImpl());
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& item : module.named_parameters())
    if (skip.insert(item.value().unsafeGetTensorImpl()).second) params.emplace_back(item.key(), item.value());
  return params;
}

namespace {

int64_t unwrapped_numel(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& [name, p] : unwrapped_parameters(module)) n += p.numel();
  return n;
}

bool selected(const std::shared_ptr<torch::nn::Module>& m, const AutoWrapPolicy& policy, const FullyShardOptions& options) {
  return !dynamic_cast<FSDPModule*>(m.get()) && !is_ignored_module(options, *m) &&
         policy.should_wrap(*m, unwrapped_numel(*m));
}

}  // namespace

void apply_auto_wrap_policy(torch::nn::Module& module, const AutoWrapPolicy& policy, const FullyShardOptions& options) {
  FullyShardOptions unit_options = options;
  unit_options.auto_wrap_policy(nullptr);
  ModuleReplacement r;
  r.descend = [](const torch::nn::Module& m) { return !dynamic_cast<const FSDPModule*>(&m); };
  r.selects = [&](const std::shared_ptr<torch::nn::Module>& m) { return selected(m, policy, options); };
  if (policy.make_unit)
    r.typed = [&](const std::shared_ptr<torch::nn::Module>& m) {
      return policy.make_unit(m, options_within(unit_options, *m));
    };
  r.type_blind = [&](const torch::nn::AnyModule& element) {
    return torch::nn::AnyModule(std::make_shared<AnyModuleUnitImpl>(element, options_within(unit_options, *element.ptr())));
  };
  replace_modules(module, r);
}

}  // namespace detail
}  // namespace fsdpp
