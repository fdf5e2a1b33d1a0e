#include "fsdp/auto_wrap.h"

#include <unordered_set>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include "fsdp/any_module_unit.h"
#include "fsdp/ignored_params.h"

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

// The name `parent` registered `child` under.
std::string child_name(const torch::nn::Module& parent, const torch::nn::Module* child) {
  for (const auto& item : parent.named_children())
    if (item.value().get() == child) return item.key();
  return {};
}

}  // namespace

void apply_auto_wrap_policy(torch::nn::Module& module, const AutoWrapPolicy& policy, const FullyShardOptions& options) {
  FullyShardOptions unit_options = options;
  unit_options.auto_wrap_policy_ = nullptr;
  for (const auto& child : module.children())
    if (!dynamic_cast<FSDPModule*>(child.get())) apply_auto_wrap_policy(*child, policy, options);

  if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&module)) {
    for (auto& element : *sequential) {
      auto original = element.ptr();
      if (!selected(original, policy, options)) continue;
      const FullyShardOptions within = options_within(unit_options, *original);
      torch::nn::AnyModule unit;
      if (policy.make_unit) unit = policy.make_unit(original, within);
      if (unit.is_empty()) unit = torch::nn::AnyModule(std::make_shared<AnyModuleUnitImpl>(element, within));
      module.replace_module(child_name(module, original.get()), unit.ptr());
      element = std::move(unit);
    }
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&module)) {
    if (!policy.make_unit) return;  // its callers name the element's type: only a typed unit fits
    for (auto& element : *list) {
      if (!selected(element, policy, options)) continue;
      torch::nn::AnyModule unit = policy.make_unit(element, options_within(unit_options, *element));
      if (unit.is_empty()) continue;
      module.replace_module(child_name(module, element.get()), unit.ptr());
      element = unit.ptr();
    }
  }
}

}  // namespace detail

std::shared_ptr<const AutoWrapPolicy> SizeBasedAutoWrapPolicy(int64_t min_num_params) {
  auto policy = std::make_shared<AutoWrapPolicy>();
  policy->should_wrap = [min_num_params](const torch::nn::Module&, int64_t unwrapped) {
    return unwrapped >= min_num_params;
  };
  return policy;
}

}  // namespace fsdpp
