#include "state_dict/model_layout.h"

#include <unordered_map>

#include <fsdpp/error.h>
#include <fsdpp/tensor_parallel.h>

#include "common/shape_string.h"

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
using TPLayouts = std::unordered_map<const c10::TensorImpl*, TensorLayout>;

void visit_module(torch::nn::Module& m, const std::string& prefix, const Owners& owners, const TPLayouts& tp,
                  ModelLayout& out) {
  if (auto* unit = dynamic_cast<FSDPModule*>(&m))
    if (!unit->sharded_parameter_names().empty()) out.units.push_back({prefix + "_flat_param", unit, out.entries.size()});
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    ModelEntry e{prefix + item.key(), item.value(), false, std::nullopt, nullptr, std::nullopt};
    auto it = owners.find(item.value().unsafeGetTensorImpl());
    if (it != owners.end()) {
      e.sharded = it->second.param;
      e.unit = it->second.unit;
    }
    if (auto t = tp.find(item.value().unsafeGetTensorImpl()); t != tp.end()) e.tp_layout = t->second;
    out.entries.push_back(std::move(e));
  }
  for (const auto& item : m.named_buffers(/*recurse=*/false))
    out.entries.push_back({prefix + item.key(), item.value(), true, std::nullopt, nullptr, std::nullopt});
  for (const auto& child : m.named_children())
    visit_module(*child.value(), is_wrapper_segment(child.key()) ? prefix : prefix + child.key() + ".", owners, tp,
                 out);
}

}  // namespace

ModelLayout collect_layout(torch::nn::Module& model) {
  Owners owners;
  for (const auto& m : model.modules(/*include_self=*/true))
    if (auto* unit = dynamic_cast<FSDPModule*>(m.get()))
      for (auto& p : unit->sharded_parameters()) owners.emplace(p.param.unsafeGetTensorImpl(), Owner{p, unit});
  // TP parameters by TensorImpl: FSDP keeps a parameter's TensorImpl, so this finds them under
  // units too.
  TPLayouts tp;
  for (const auto& p : tensor_parallel_parameters(model)) tp.emplace(p.param.unsafeGetTensorImpl(), p.layout);
  ModelLayout layout;
  visit_module(model, "", owners, tp, layout);
  return layout;
}

void refuse_tensor_parallel(const ModelLayout& layout, const std::string& api, const std::string& what,
                            const std::string& instead) {
  for (const auto& e : layout.entries) {
    if (!e.tp_layout) continue;
    const TensorLayout& l = *e.tp_layout;
    throw Error(api + ": '" + e.key + "' is tensor-parallel (global shape " + shape_string(l.global_shape()) + ", " +
                l.placements().front().to_string() + " over the TP group of " +
                std::to_string(l.process_group().size()) + " ranks" + (e.sharded ? ", then FSDP-sharded: 2-D" : "") +
                "); " + what + " of tensor-parallel models: not supported yet" + (instead.empty() ? "" : ": " + instead));
  }
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
