#include "nn/replace_modules.h"

#include <string>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

namespace fsdpp::detail {
namespace {

// The name `parent` registered `child` under.
std::string child_name(const torch::nn::Module& parent, const torch::nn::Module* child) {
  for (const auto& item : parent.named_children())
    if (item.value().get() == child) return item.key();
  return {};
}

}  // namespace

int replace_modules(torch::nn::Module& module, const ModuleReplacement& r) {
  int replaced = 0;
  for (const auto& child : module.children())
    if (r.descend(*child)) replaced += replace_modules(*child, r);

  if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&module)) {
    for (auto& element : *sequential) {
      auto original = element.ptr();
      if (!r.selects(original)) continue;
      torch::nn::AnyModule wrapper;
      if (r.typed) wrapper = r.typed(original);
      if (wrapper.is_empty() && r.type_blind) wrapper = r.type_blind(element);
      if (wrapper.is_empty()) continue;
      module.replace_module(child_name(module, original.get()), wrapper.ptr());
      element = std::move(wrapper);
      ++replaced;
    }
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&module)) {
    if (!r.typed) return replaced;  // its callers name the element's type: only a typed wrapper fits
    for (auto& element : *list) {
      if (!r.selects(element)) continue;
      torch::nn::AnyModule wrapper = r.typed(element);
      if (wrapper.is_empty()) continue;
      module.replace_module(child_name(module, element.get()), wrapper.ptr());
      element = wrapper.ptr();
      ++replaced;
    }
  }
  return replaced;
}

}  // namespace fsdpp::detail
