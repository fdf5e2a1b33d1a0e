// ZeroRedundancyOptimizer's construction and parameter groups: what a parameter must be, adding a
// group, clearing gradients, and the Join hook. The rest lives by concept beside this file:
// partition.cpp, local_optimizer.cpp, zero_state_dict.cpp, ddp_overlap.cpp.
#include <ATen/ATen.h>
#include <c10/util/Type.h>

#include <fsdpp/zero_redundancy_optimizer.h>

namespace fsdpp {

namespace detail {
std::string demangled(const std::type_info& type) { return c10::demangle(type.name()); }
}  // namespace detail

namespace {

using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamGroup;

// Checks one parameter for ZeRO's requirements; `first` is the parameter that fixes the dtype.
void check_param(const at::Tensor& p, const std::string& name, const at::Tensor* first, const std::string& first_name) {
  if (!p.defined()) throw Error("ZeroRedundancyOptimizer: " + name + " is an undefined tensor");
  if (p.layout() != at::kStrided)
    throw Error("ZeroRedundancyOptimizer only supports dense parameters of one type: " + name + " has layout " +
                c10::str(p.layout()) + " (sparse parameters are not supported)");
  if (!p.is_leaf()) throw Error("ZeroRedundancyOptimizer: " + name + " is not a leaf tensor (can't optimize a non-leaf tensor)");
  if (first && p.scalar_type() != first->scalar_type())
    throw Error("ZeroRedundancyOptimizer only supports using the same dense type for all parameters: " + first_name +
                " is " + c10::toString(first->scalar_type()) + ", " + name + " is " + c10::toString(p.scalar_type()));
}

class ZeroJoinHook : public JoinHook {
 public:
  explicit ZeroJoinHook(ZeroRedundancyOptimizerBase& zero) : zero_(zero) {}
  // A joined rank takes the step the others take: it updates its own partition with the
  // gradients it has and broadcasts it, matching the others' broadcasts.
  void main_hook() override { zero_.step(); }

 private:
  ZeroRedundancyOptimizerBase& zero_;
};

}  // namespace

ZeroRedundancyOptimizerBase::ZeroRedundancyOptimizerBase(std::vector<OptimizerParamGroup> param_groups,
                                                         std::unique_ptr<OptimizerOptions> defaults,
                                                         const ProcessGroup& group, bool parameters_as_bucket_view)
    : torch::optim::Optimizer(std::move(param_groups), std::move(defaults)),
      group_(group.defined() ? group : default_group()),
      bucket_view_(parameters_as_bucket_view) {
  if (!group_.is_member())
    throw Error("ZeroRedundancyOptimizer: this process is not a member of process group " + group_.name());
  rank_ = group_.rank();
  world_size_ = group_.size();
}

ZeroRedundancyOptimizerBase::~ZeroRedundancyOptimizerBase() = default;

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizerBase::checked(
    std::vector<OptimizerParamGroup> groups, const std::function<bool(const OptimizerOptions&)>& options_ok,
    const std::string& options_name) {
  const at::Tensor* first = nullptr;
  std::string first_name;
  int64_t index = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].has_options() && !options_ok(groups[g].options()))
      throw Error("ZeroRedundancyOptimizer: parameter group " + std::to_string(g) + " has options of type " +
                  detail::demangled(typeid(groups[g].options())) + ", expected " + options_name);
    for (const auto& p : groups[g].params()) {
      const std::string name = "parameter " + std::to_string(index++) + " (group " + std::to_string(g) + ")";
      check_param(p, name, first, first_name);
      if (!first) {
        first = &p;
        first_name = name;
      }
    }
  }
  if (index == 0) throw Error("ZeroRedundancyOptimizer did not receive any parameters");
  return groups;
}

void ZeroRedundancyOptimizerBase::zero_grad(bool set_to_none) {
  for (auto& group : param_groups_)
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        p.mutable_grad().reset();
      } else {
        p.mutable_grad().detach_();
        p.mutable_grad().zero_();
      }
    }
}

void ZeroRedundancyOptimizerBase::add_param_group(const OptimizerParamGroup& param_group) {
  if (overlap_with_ddp())
    throw Error("ZeroRedundancyOptimizer::add_param_group is not supported with overlap_with_ddp");
  const size_t g = param_groups_.size();
  if (param_group.has_options() && !options_compatible(param_group.options()))
    throw Error("ZeroRedundancyOptimizer::add_param_group: the group has options of type " +
                detail::demangled(typeid(param_group.options())) + ", expected " + options_type_name());
  const auto& params = param_group.params();
  for (size_t i = 0; i < params.size(); ++i)
    check_param(params[i], "parameter " + std::to_string(all_params_.size() + i) + " (group " + std::to_string(g) + ")",
                &all_params_.front(), "parameter 0");
  check_no_duplicates(params);

  torch::optim::Optimizer::add_param_group(param_group);
  partition_group(g);
  local_->add_param_group(OptimizerParamGroup(local_params(g), param_groups_[g].options().clone()));
  if (bucket_view_) build_buckets();
  invalidate_consolidated("add_param_group() ran after consolidate_state_dict()");
}

std::unique_ptr<JoinHook> ZeroRedundancyOptimizerBase::join_hook() { return std::make_unique<ZeroJoinHook>(*this); }

c10::Device ZeroRedundancyOptimizerBase::join_device() const { return all_params_.front().device(); }

}  // namespace fsdpp
