#include "fsdp/ignored_params.h"

#include <algorithm>

#include <fsdpp/error.h>

#include "common/shape_string.h"

namespace fsdpp::detail {
namespace {

std::unordered_set<const c10::TensorImpl*> parameter_set(const torch::nn::Module& module) {
  std::unordered_set<const c10::TensorImpl*> out;
  for (const auto& p : module.parameters()) out.insert(p.unsafeGetTensorImpl());
  return out;
}

bool contains_module(const torch::nn::Module& module, const torch::nn::Module* m) {
  if (&module == m) return true;
  for (const auto& child : module.modules(/*include_self=*/false))
    if (child.get() == m) return true;
  return false;
}

}  // namespace

std::unordered_set<const c10::TensorImpl*> ignored_parameters(const torch::nn::Module& module,
                                                              const FullyShardOptions& options, const std::string& unit) {
  const auto own = parameter_set(module);
  std::unordered_set<const c10::TensorImpl*> ignored;
  for (size_t i = 0; i < options.ignored_params().size(); ++i) {
    const at::Tensor& p = options.ignored_params()[i];
    if (!p.defined() || !own.count(p.unsafeGetTensorImpl()))
      throw Error("fully_shard of " + unit + ": ignored_params[" + std::to_string(i) + "] " +
                  (p.defined() ? "(shape " + shape_string(p.sizes()) + ")" : "(undefined)") +
                  " is not a parameter of the module");
    ignored.insert(p.unsafeGetTensorImpl());
  }
  for (size_t i = 0; i < options.ignored_modules().size(); ++i) {
    const auto& m = options.ignored_modules()[i];
    if (!m || !contains_module(module, m.get()))
      throw Error("fully_shard of " + unit + ": ignored_modules[" + std::to_string(i) + "] " +
                  (m ? "(" + m->name() + ")" : "(null)") + " is not the module or one of its submodules");
    for (const auto& p : m->parameters()) ignored.insert(p.unsafeGetTensorImpl());
  }
  return ignored;
}

bool is_ignored_module(const FullyShardOptions& options, const torch::nn::Module& m) {
  return std::any_of(options.ignored_modules().begin(), options.ignored_modules().end(),
                     [&](const auto& ignored) { return ignored.get() == &m; });
}

FullyShardOptions options_within(FullyShardOptions options, const torch::nn::Module& submodule) {
  const auto own = parameter_set(submodule);
  auto& params = options.ignored_params();
  params.erase(std::remove_if(params.begin(), params.end(),
                              [&](const at::Tensor& p) { return !p.defined() || !own.count(p.unsafeGetTensorImpl()); }),
               params.end());
  auto& modules = options.ignored_modules();
  modules.erase(std::remove_if(modules.begin(), modules.end(),
                               [&](const auto& m) { return !m || !contains_module(submodule, m.get()); }),
                modules.end());
  return options;
}

}  // namespace fsdpp::detail
