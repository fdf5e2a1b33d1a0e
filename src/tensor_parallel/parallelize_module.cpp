// parallelize_module: resolves a TP plan's FQNs, puts TensorParallel wrappers in place of the
// plain Linear/Embedding/LayerNorm elements of Sequential and ModuleList containers (libtorch has no
// forward hooks; a wrapper must sit where its caller calls it) and shards them.
#include <fsdpp/tensor_parallel.h>

#include <map>
#include <set>
#include <string>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/normalization.h>

#include <fsdpp/error.h>

#include "nn/replace_modules.h"
#include "tensor_parallel/parallel_style.h"

namespace fsdpp {
namespace {

using ModuleMap = std::map<std::string, std::shared_ptr<torch::nn::Module>>;

ModuleMap modules_by_fqn(torch::nn::Module& module) {
  ModuleMap out;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) out.emplace(item.key(), item.value());
  return out;
}

std::string parent_fqn(const std::string& fqn) {
  const auto dot = fqn.rfind('.');
  return dot == std::string::npos ? std::string() : fqn.substr(0, dot);
}

std::string some_names(const ModuleMap& modules) {
  std::string names;
  int shown = 0;
  for (const auto& [fqn, m] : modules) {
    if (shown++ == 12) return names + ", ...";
    names += (names.empty() ? "'" : ", '") + fqn + "'";
  }
  return names.empty() ? "none" : names;
}

bool wrappable(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::LinearImpl*>(&m) || dynamic_cast<const torch::nn::EmbeddingImpl*>(&m) ||
         dynamic_cast<const torch::nn::LayerNormImpl*>(&m);
}

torch::nn::AnyModule wrapper_of(const std::shared_ptr<torch::nn::Module>& m) {
  if (auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(m))
    return torch::nn::AnyModule(std::make_shared<TensorParallelImpl<torch::nn::LinearImpl>>(linear));
  if (auto embedding = std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(m))
    return torch::nn::AnyModule(std::make_shared<TensorParallelImpl<torch::nn::EmbeddingImpl>>(embedding));
  if (auto norm = std::dynamic_pointer_cast<torch::nn::LayerNormImpl>(m))
    return torch::nn::AnyModule(std::make_shared<TensorParallelImpl<torch::nn::LayerNormImpl>>(norm));
  return {};
}

}  // namespace

void parallelize_module(torch::nn::Module& module, const ProcessGroup& tp_group, const ParallelizePlan& plan) {
  const ProcessGroup group = tp_group.defined() ? tp_group : default_group();
  const ModuleMap modules = modules_by_fqn(module);
  // Check the whole plan first, so a bad entry leaves the model as it was.
  std::set<std::string> seen;
  std::set<const torch::nn::Module*> to_wrap;
  for (const auto& [fqn, style] : plan) {
    const std::string who = "parallelize_module: the plan's '" + fqn + "'";
    if (!seen.insert(fqn).second) throw Error(who + " appears twice");
    const auto it = modules.find(fqn);
    if (it == modules.end())
      throw Error(who + " names no submodule of " + module.name() + " (its submodules: " + some_names(modules) + ")");
    const auto& m = it->second;
    if (const auto* tp = dynamic_cast<const TensorParallelModule*>(m.get())) {
      if (tp->is_parallelized()) throw Error(who + " is already parallelized");
      detail::check_style_applies(style, *tp->wrapped_module(), who);
      continue;
    }
    detail::check_style_applies(style, *m, who);
    if (!wrappable(*m))
      throw Error(who + " is a plain " + m->name() + ": parallelize_module puts wrappers in place of Linear, "
                  "Embedding and LayerNorm elements of a Sequential or ModuleList only; declare it as "
                  "fsdpp::TensorParallel<" + m->name() + ">");
    const std::string parent = parent_fqn(fqn);
    torch::nn::Module* p = parent.empty() ? &module : modules.at(parent).get();
    if (!dynamic_cast<torch::nn::SequentialImpl*>(p) && !dynamic_cast<torch::nn::ModuleListImpl*>(p))
      throw Error(who + " (" + m->name() + ") is held by " + (parent.empty() ? "the root" : "'" + parent + "'") +
                  " (" + p->name() + ")" +
                  " outside a Sequential or ModuleList, which calls it through a typed member that cannot be "
                  "swapped for the wrapper: declare that member as fsdpp::TensorParallel<" + m->name() + ">");
    to_wrap.insert(m.get());
  }

  if (!to_wrap.empty()) {
    detail::ModuleReplacement r;
    r.descend = [](const torch::nn::Module&) { return true; };
    r.selects = [&](const std::shared_ptr<torch::nn::Module>& m) { return to_wrap.count(m.get()) > 0; };
    r.typed = wrapper_of;
    const int replaced = detail::replace_modules(module, r);
    if (replaced != static_cast<int>(to_wrap.size()))
      throw Error("parallelize_module: wrapped " + std::to_string(replaced) + " of " +
                  std::to_string(to_wrap.size()) + " modules (is one module held twice?)");
  }

  const ModuleMap wrapped = modules_by_fqn(module);
  for (const auto& [fqn, style] : plan)
    dynamic_cast<TensorParallelModule&>(*wrapped.at(fqn)).parallelize(style, group, fqn);
}

void parallelize_module(torch::nn::Module& module, const DeviceMesh& tp_mesh, const ParallelizePlan& plan) {
  if (!tp_mesh.defined() || tp_mesh.ndim() != 1)
    throw Error("parallelize_module: the TP mesh must be 1-D (pass mesh[\"tp\"] of a larger mesh); got " +
                std::to_string(tp_mesh.defined() ? tp_mesh.ndim() : 0) + " dimensions");
  parallelize_module(module, tp_mesh.get_group(), plan);
}

}  // namespace fsdpp
