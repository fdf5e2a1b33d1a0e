// ModelLayout: the model's entries under plain keys (model/plain_key.h), and the TensorLayout
// each one's value lies over, as FSDP and tensor parallelism compose on each parameter
// (model/parameter_placement.h).
#include <fsdpp/model_layout.h>

#include "model/parameter_placement.h"
#include "model/plain_key.h"

namespace fsdpp {
namespace {

using Entry = ModelLayout::Entry;

// `m`, under plain name `name`: its unit, its parameters, buffers, then children.
void visit_module(torch::nn::Module& m, const std::string& name, const detail::ParameterPlacements& placements,
                  ModelLayout& out) {
  if (auto* unit = dynamic_cast<FSDPModule*>(&m))
    if (!unit->sharded_parameter_names().empty())
      out.units.push_back({detail::plain_name(name, "_flat_param"), unit, out.entries.size()});
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    detail::ParameterPlacement p = detail::placement_of(item.value(), placements);
    out.entries.push_back({detail::plain_name(name, item.key()), item.value(), false, std::move(p.sharded), p.unit,
                           std::move(p.tp_layout), std::nullopt});
  }
  for (const auto& item : m.named_buffers(/*recurse=*/false))
    out.entries.push_back(
        {detail::plain_name(name, item.key()), item.value(), true, std::nullopt, nullptr, std::nullopt, std::nullopt});
  for (const auto& child : m.named_children())
    visit_module(*child.value(), detail::plain_name(name, child.key()), placements, out);
}

}  // namespace

ModelLayout::ModelLayout(torch::nn::Module& model) {
  visit_module(model, "", detail::parameter_placements(model), *this);
  // Each entry's layout, in module order (a 2-D one's first is collective: composed_layout).
  for (auto& e : entries)
    if (!e.is_buffer) e.layout = detail::composed_layout({e.sharded, e.unit, e.tp_layout}, e.key);
}

}  // namespace fsdpp
