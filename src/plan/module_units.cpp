// units_of: a module's FSDP units as an auto-wrap policy cuts it, from parameter shapes alone.
#include <string>
#include <unordered_set>
#include <vector>

#include <torch/nn/module.h>

#include <fsdpp/fully_shard_options.h>
#include <fsdpp/plan.h>

namespace fsdpp::plan {
namespace {

struct Cutter {
  const AutoWrapPolicy& policy;
  std::unordered_set<const void*> seen;  // a shared parameter belongs to the first module holding it
  std::vector<UnitShapes> inner;

  // Appends the shapes of `module`'s parameters that no unit inside it takes to `out`, bottom-up.
  void collect(const torch::nn::Module& module, const std::string& name, bool is_root, UnitShapes& out) {
    UnitShapes own{name, {}};
    for (const auto& p : module.named_parameters(/*recurse=*/false))
      if (seen.insert(p.value().unsafeGetTensorImpl()).second) own.shapes.push_back(p.value().sizes().vec());
    for (const auto& child : module.named_children()) {
      UnitShapes sub{name.empty() ? child.key() : name + "." + child.key(), {}};
      collect(*child.value(), sub.name, false, sub);
      own.shapes.insert(own.shapes.end(), sub.shapes.begin(), sub.shapes.end());
    }
    int64_t numel = 0;
    for (const auto& shape : own.shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      numel += n;
    }
    if (!is_root && !own.shapes.empty() && policy.should_wrap && policy.should_wrap(module, numel)) {
      inner.push_back(std::move(own));
      return;
    }
    out.shapes.insert(out.shapes.end(), own.shapes.begin(), own.shapes.end());
  }
};

}  // namespace

std::vector<UnitShapes> units_of(const torch::nn::Module& model, const AutoWrapPolicy& policy) {
  Cutter cutter{policy, {}, {}};
  UnitShapes root{"root", {}};
  cutter.collect(model, "", /*is_root=*/true, root);
  std::vector<UnitShapes> units{std::move(root)};
  units.insert(units.end(), cutter.inner.begin(), cutter.inner.end());
  return units;
}

}  // namespace fsdpp::plan
