// FSDPParamGroup's construction and deferred init: the checks of the parameters, the
// collectives that run once at wrapping (the all-reduce that checks every rank built the same
// unit; sync_module_states' broadcast from rank 0) and materialize_module's initialization of
// a unit built on the meta device. The step's collectives are fsdp_collectives'.
#include "fsdp/fsdp_param_group.h"

#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "fsdp/storage_memory.h"
#include "fsdp/sync_module_states.h"
#include "memory/allocator_caching.h"

namespace fsdpp::detail {
namespace {

// Throws if the ranks' parameters (names, shapes, dtypes) of a unit differ over any of `groups`
// (the undefined ones skipped).
void check_same_on_all_ranks(const std::vector<FSDPParam>& params, const std::string& unit,
                             std::initializer_list<const ProcessGroup*> groups) {
  // A fingerprint of the unit's parameter names, shapes and dtypes; MAX of (h, -h) over the
  // group equals (h, -h) on every rank only if all ranks agree.
  std::string description;
  for (const auto& p : params) {
    std::ostringstream one;
    one << "'" << p.fqn() << "' " << p.param().sizes() << " " << c10::toString(p.param().scalar_type()) << "; ";
    description += one.str();
  }
  const int64_t h = static_cast<int64_t>(std::hash<std::string>{}(description) >> 1);
  for (const ProcessGroup* group : groups) {
    if (!group->defined()) continue;
    at::Tensor t = at::tensor(std::vector<int64_t>{h, -h}, at::kLong);
    all_reduce(t, ReduceOp::MAX, *group);
    if (t[0].item<int64_t>() != h || t[1].item<int64_t>() != -h)
      throw Error("fully_shard of " + unit + ": the ranks' models differ; rank " + std::to_string(group->rank()) +
                  " of group " + group->name() + " has " + description + "build the same model on every rank");
  }
}

}  // namespace

FSDPParamGroup::FSDPParamGroup(std::vector<std::pair<std::string, at::Tensor>> params, UnitGroups groups,
                               std::string unit_name, std::string trace_name, const ParamGroupPolicies& policies)
    : unit_name_(std::move(unit_name)),
      trace_name_(std::move(trace_name)),
      process_group_(std::move(groups.shard)),
      replicate_group_(groups.replicated() ? std::move(groups.replicate) : ProcessGroup()),
      offload_policy_(policies.offload_policy),
      param_dtype_(policies.mp_policy.param_dtype()),
      reduce_dtype_(policies.mp_policy.reduce_dtype()),
      reshard_policy_(policies.reshard_after_forward),
      gradient_reduce_(process_group_, replicate_group_) {
  if (!process_group_.is_member()) throw Error("fully_shard of " + unit_name_ + ": this rank is not a member of group " + process_group_.name());
  rank_ = process_group_.rank();
  world_size_ = process_group_.size();
  if (post_forward_size() > 0) post_forward_group_ = post_forward_group(process_group_, post_forward_size());
  if (params.empty()) throw Error("fully_shard of " + unit_name_ + ": no parameters to shard");
  const at::Tensor& first = params.front().second;
  for (auto& [name, p] : params) {
    if (p.scalar_type() != first.scalar_type() || p.device() != first.device())
      throw Error("fully_shard of " + unit_name_ + ": parameter '" + name + "' is " +
                  std::string(c10::toString(p.scalar_type())) + " on " + p.device().str() + " but '" +
                  params.front().first + "' is " + std::string(c10::toString(first.scalar_type())) + " on " +
                  first.device().str() + "; one unit needs one dtype and device");
    if (!p.is_contiguous() || p.layout() != at::kStrided)
      throw Error("fully_shard of " + unit_name_ + ": parameter '" + name + "' must be a dense contiguous tensor");
    params_.emplace_back(name, p, process_group_);
  }
  check_same_on_all_ranks(params_, unit_name_, {&process_group_, &replicate_group_});
  flat_layout_ = UnitFlatLayout(params_, world_size_);
  gather_layout_ = std::make_shared<const GatherLayout>(flat_layout_.gather_layout());
  if (post_forward_size() > 0)
    post_forward_gather_layout_ = std::make_shared<const GatherLayout>(flat_layout_.gather_layout(world_size_ / post_forward_size()));
  deferred_ = first.is_meta();
  compute_device_ = policies.device_id.value_or(deferred_ ? at::Device(at::kCPU) : first.device());
  // Read once the check's all-reduce decided the group's transport (on its comm thread).
  all_gather_.choose_path(process_group_, compute_device_);
  // The full parameters this frees are never allocated again: back to the system, not cached.
  NoCachingScope no_caching;
  const at::Tensor from_rank0 = policies.sync_module_states ? broadcast_from_rank0(first.scalar_type()) : at::Tensor();
  bind_flat_buffers(sharded_options(first.scalar_type()), /*initial=*/true);
  if (from_rank0.defined()) {
    bind_unsharded(from_rank0);
    for (auto& p : params_) p.write_back_unsharded();
    release_storage(from_rank0);  // before the compute buffer's momentary bytes: one unit at a time
    rebind_compute_buffer();
    deferred_ = false;
  }
}

at::Tensor FSDPParamGroup::broadcast_from_rank0(at::ScalarType dtype) {
  at::Tensor full = at::empty({flat_layout_.unsharded_numel()}, at::TensorOptions().dtype(dtype).device(compute_device_));
  bind_unsharded(full);
  const bool source = is_sync_source(process_group_, replicate_group_);
  if (source && !deferred_)
    for (auto& p : params_) p.copy_full_into_unsharded();
  agree_source_has_values(source && !deferred_, process_group_, replicate_group_, unit_name_,
                          "'" + params_.front().fqn() + "'");
  broadcast_along_sync_path(full, process_group_, replicate_group_);
  return full;
}

void FSDPParamGroup::materialize(const std::function<void()>& init) {
  if (is_unsharded() || all_gather_.in_flight())
    throw Error("FSDP unit " + unit_name_ + ": materialize while its parameters are gathered");
  // Computing on the CPU in the parameters' own dtype: the compute buffer itself, whose views they
  // already are (nothing to rebind, so nothing can be left pointing at freed memory). Otherwise a
  // host buffer of their dtype, the views rebound to the compute buffer afterwards: initializers
  // draw from the CPU generator, so a unit computing on a GPU gets the CPU's values.
  const bool own_dtype = unsharded_flat_.scalar_type() == sharded_flat_.scalar_type() && compute_device_.is_cpu();
  at::Tensor full = unsharded_flat_;
  if (own_dtype) {
    allocate_storage(unsharded_flat_);
  } else {
    full = at::empty({flat_layout_.unsharded_numel()}, sharded_flat_.options().device(at::kCPU).pinned_memory(false));
    bind_unsharded(full);
  }
  for (auto& p : params_) p.to_unsharded();
  auto back_to_shards = [&](bool keep_values) {
    for (auto& p : params_) {
      if (keep_values) p.write_back_unsharded();
      p.to_sharded();
    }
    release_storage(full);
    if (!own_dtype) rebind_compute_buffer();
  };
  try {
    init();
  } catch (...) {
    back_to_shards(/*keep_values=*/false);
    throw;
  }
  back_to_shards(/*keep_values=*/true);
  deferred_ = false;
}

}  // namespace fsdpp::detail
