#include "state_dict/model_layout.h"

#include <unordered_map>

namespace fsdpp::detail {
namespace {

// The wrappers' own segments, which state dict keys leave out (as PyTorch's FSDP and
// CheckpointWrapper state-dict hooks do), so a plain model loads them and vice versa.
bool is_wrapper_segment(const std::string& name) {
  return name == "_fsdp_wrapped_module" || name == "_checkpoint_wrapped_module";
}

struct Owner {
  ShardedParameter param;
  FSDPModule* unit;
};
using Owners = std::unordered_map<const c10::TensorImpl*, Owner>;

void visit_module(torch::nn::Module& m, const std::string& prefix, const Owners& owners, ModelLayout& out) {
  if (auto* unit = dynamic_cast<FSDPModule*>(&m))
    if (!unit->sharded_parameter_names().empty()) out.units.push_back({prefix + "_flat_param", unit, out.entries.size()});
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    ModelEntry e{prefix + item.key(), item.value(), false, std::nullopt, nullptr};
    auto it = owners.find(item.value().unsafeGetTensorImpl());
    if (it != owners.end()) {
      e.sharded = it->second.param;
      e.unit = it->second.unit;
    }
    out.entries.push_back(std::move(e));
  }
  for (const auto& item : m.named_buffers(/*recurse=*/false))
    out.entries.push_back({prefix + item.key(), item.value(), true, std::nullopt, nullptr});
  for (const auto& child : m.named_children())
    visit_module(*child.value(), is_wrapper_segment(child.key()) ? prefix : prefix + child.key() + ".", owners, out);
}

}  // namespace

ModelLayout collect_layout(torch::nn::Module& model) {
  Owners owners;
  for (const auto& m : model.modules(/*include_self=*/true))
    if (auto* unit = dynamic_cast<FSDPModule*>(m.get()))
      for (auto& p : unit->sharded_parameters()) owners.emplace(p.param.unsafeGetTensorImpl(), Owner{p, unit});
  ModelLayout layout;
  visit_module(model, "", owners, layout);
  return layout;
}

std::unordered_map<const c10::TensorImpl*, at::Tensor> gather_full_params(const ModelLayout& layout) {
  std::unordered_map<const c10::TensorImpl*, at::Tensor> out;
  for (const auto& u : layout.units) {
    auto params = u.unit->sharded_parameters();
    auto full = u.unit->full_parameters();
    for (size_t i = 0; i < params.size(); ++i) out[params[i].param.unsafeGetTensorImpl()] = std::move(full[i]);
  }
  return out;
}

}  // namespace fsdpp::detail
