#include <algorithm>
#include <exception>
#include <optional>
#include <unordered_set>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>
#include <fsdpp/fully_shard.h>

#include "compat/meta_device.h"
#include "fsdp/auto_wrap.h"
#include "fsdp/fsdp_state.h"
#include "fsdp/ignored_params.h"
#include "fsdp/sync_module_states.h"
#include "fsdp/unit_groups.h"

namespace fsdpp {

namespace {

// A floating-point tensor in `dtype` (mixed precision's input and output casts); others as they are.
void cast_floating(at::Tensor& t, at::ScalarType dtype) {
  if (t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != dtype) t = t.to(dtype);
}

// The parameters a unit will shard (all of the module's that no inner unit owns and that are
// not ignored) share one device: the compute device, or the meta device (deferred_init). With a
// device_id, the CPU too (they are sharded onto it), but no other accelerator.
void check_parameter_devices(const torch::nn::Module& module, const std::unordered_set<const c10::TensorImpl*>& ignored,
                             const std::optional<at::Device>& device_id, const std::string& unit) {
  std::optional<std::pair<std::string, at::Device>> first;
  for (const auto& [name, p] : detail::unwrapped_parameters(module)) {
    if (ignored.count(p.unsafeGetTensorImpl())) continue;
    if (device_id && !p.is_cpu() && !p.is_meta() && p.device() != *device_id)
      throw Error("fully_shard of " + unit + ": parameter '" + name + "' is on " + p.device().str() + " but device_id is " +
                  device_id->str() + "; build the module on the CPU, on " + device_id->str() +
                  " or under deferred_init, or give the device it is on");
    if (!first) {
      first.emplace(name, p.device());
    } else if (p.device() != first->second) {
      throw Error("fully_shard of " + unit + ": parameter '" + name + "' is on " + p.device().str() + " but '" +
                  first->first + "' is on " + first->second.str() +
                  "; the parameters a unit shards are computed with on one device (move the module first, or build "
                  "all of the unit under deferred_init)");
    }
  }
}

// The buffers of the modules no inner unit owns (each unit takes care of its own).
std::vector<std::pair<std::string, at::Tensor>> unit_buffers(const torch::nn::Module& module) {
  std::unordered_set<const c10::TensorImpl*> inner;
  for (const auto& m : module.modules())
    if (auto* f = dynamic_cast<FSDPModule*>(m.get()))
      for (const auto& b : f->buffers()) inner.insert(b.unsafeGetTensorImpl());
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  for (const auto& b : module.named_buffers())
    if (b.value().defined() && !inner.count(b.value().unsafeGetTensorImpl())) buffers.emplace_back(b.key(), b.value());
  return buffers;
}

// device_id: the unit's buffers computed with where its parameters are (deferred ones get their
// memory there from materialize_module or to_empty); those of ignored modules stay, as their
// parameters do (FSDP1's _move_module_to_device).
void move_buffers_to(const torch::nn::Module& module, const at::Device& device,
                     const std::vector<std::shared_ptr<torch::nn::Module>>& ignored_modules) {
  std::unordered_set<const c10::TensorImpl*> ignored;
  for (const auto& m : ignored_modules)
    for (const auto& b : m->buffers()) ignored.insert(b.unsafeGetTensorImpl());
  at::NoGradGuard no_grad;
  for (auto& [name, b] : unit_buffers(module))
    if (!b.is_meta() && b.device() != device && !ignored.count(b.unsafeGetTensorImpl())) b.set_data(b.to(device));
}

// sync_module_states for buffers, which no unit shards: those of the modules no inner unit owns
// take rank 0's values, along the same path as the parameters (memory first where deferred).
void sync_buffers_from_rank0(const torch::nn::Module& module, const detail::UnitGroups& groups, const std::string& unit,
                             const std::optional<at::Device>& device_id) {
  const auto buffers = unit_buffers(module);
  if (buffers.empty()) return;  // the same on every rank (one model)
  // The replicate group only where it has peers, as the buffers always took it.
  const ProcessGroup replicate = groups.replicated() ? groups.replicate : ProcessGroup();
  bool has_values = true;
  for (const auto& [name, t] : buffers) has_values = has_values && !t.is_meta();
  detail::agree_source_has_values(detail::is_sync_source(groups.shard, replicate) && has_values, groups.shard, replicate,
                                  unit, "buffer '" + buffers.front().first + "'");
  for (const auto& [name, t] : buffers) {
    if (t.is_meta()) compat::give_meta_tensor_memory(t, device_id.value_or(at::kCPU));
    detail::broadcast_along_sync_path(t, groups.shard, replicate);
  }
}

}  // namespace

FSDPModule::FSDPModule(std::shared_ptr<torch::nn::Module> module, FullyShardOptions options)
    : module_(std::move(module)), mp_policy_(options.mp_policy()) {
  if (!module_) throw Error("FullyShardedDataParallel: the module is null");
  if (dynamic_cast<FSDPModule*>(module_.get()))
    throw Error("FullyShardedDataParallel: " + module_->name() + " is already a FullyShardedDataParallel");
  register_module("_fsdp_wrapped_module", module_);
  // FSDP1's rule: a device_id without an index is the current device of its type.
  if (options.device_id() && !options.device_id()->is_cpu() && !options.device_id()->has_index())
    options.device_id(c10::impl::getDeviceGuardImpl(options.device_id()->type())->getDevice());
  // Every option is checked before anything in the module changes.
  const std::string unit = module_->name();
  detail::UnitGroups groups = detail::unit_groups(options, unit);
  // FSDP1's strategies that keep the gathered parameters from forward to backward (NO_SHARD's
  // "gather" is a copy within a one-rank group).
  const auto strategy = options.sharding_strategy();
  if (strategy == ShardingStrategy::SHARD_GRAD_OP || strategy == ShardingStrategy::NO_SHARD)
    options.reshard_after_forward(false);
  options.reshard_after_forward().check(groups.shard.size(), unit, groups.shard.name());
  mp_policy_.check(unit);
  const auto ignored = detail::ignored_parameters(*module_, options, unit);
  check_parameter_devices(*module_, ignored, options.device_id(), unit);
  if (options.auto_wrap_policy()) detail::apply_auto_wrap_policy(*module_, *options.auto_wrap_policy(), options);
  // Parameters owned by inner units stay theirs; ignored ones stay the module's.
  auto params = detail::unwrapped_parameters(*module_);
  params.erase(std::remove_if(params.begin(), params.end(),
                              [&](const auto& p) { return ignored.count(p.second.unsafeGetTensorImpl()) > 0; }),
               params.end());
  if (options.device_id()) move_buffers_to(*module_, *options.device_id(), options.ignored_modules());
  if (options.sync_module_states()) sync_buffers_from_rank0(*module_, groups, unit, options.device_id());
  state_ = std::make_shared<detail::FSDPState>(
      unit, std::move(params), std::move(groups),
      detail::ParamGroupPolicies{options.reshard_after_forward(), mp_policy_, options.offload_policy(),
                                 options.sync_module_states(), options.device_id()},
      options.backward_prefetch());
  state_->register_self();
}

FSDPModule::~FSDPModule() = default;

void FSDPModule::forward_steps(const std::vector<at::Tensor*>& inputs,
                               const std::function<std::vector<at::Tensor*>()>& invoke) {
  if (!state_->lazy_initialized()) {
    std::vector<std::shared_ptr<detail::FSDPState>> inner;
    for (const auto& m : modules())
      if (auto* f = dynamic_cast<FSDPModule*>(m.get())) {
        if (f->has_deferred_parameters())
          throw Error("FSDP unit " + f->state_->name() + " was built under fsdpp::deferred_init and its parameters " +
                      "hold no values yet: call fsdpp::materialize_module(model), or fsdpp::to_empty(model) and " +
                      "load a checkpoint, before the first forward");
        if (f != this) inner.push_back(f->state_);
      }
    state_->lazy_init_as_root(inner);
  }
  state_->pre_forward();
  if (state_->is_root() && state_->input_device())
    for (at::Tensor* t : inputs)
      if (t->defined() && t->device() != *state_->input_device()) *t = t->to(*state_->input_device());
  const MixedPrecisionPolicy& mp = mp_policy_;
  if (mp.cast_forward_inputs() && mp.param_dtype())
    for (at::Tensor* t : inputs) cast_floating(*t, *mp.param_dtype());
  const bool grad = torch::autograd::GradMode::is_enabled();
  auto needs_grad = [](const at::Tensor* t) { return t->defined() && t->requires_grad(); };
  if (grad)
    for (at::Tensor* t : inputs)
      if (needs_grad(t)) *t = state_->attach_post_backward(*t);
  std::vector<at::Tensor*> outputs = invoke();
  state_->post_forward();
  for (at::Tensor* t : outputs) {
    if (grad && needs_grad(t)) *t = state_->attach_pre_backward(*t);
    if (mp.output_dtype()) cast_floating(*t, *mp.output_dtype());
  }
}

UnshardHandle FSDPModule::unshard(bool async_op) {
  if (auto* g = state_->param_group()) {
    g->unshard();
    if (!async_op) g->wait_for_unshard();
  }
  return UnshardHandle(state_);
}

void UnshardHandle::wait() {
  if (auto state = state_.lock())
    if (auto* g = state->param_group()) g->wait_for_unshard();
}

void FSDPModule::reshard() {
  if (auto* g = state_->param_group()) g->reshard();
}

void FSDPModule::set_checkpoint_wrapped_module(bool value) {
  if (value && !can_checkpoint_wrapped_module())
    throw Error("activation checkpointing of the FSDP unit of " + module_->name() +
                ": its forward takes or returns no tensor, so there is nothing to recompute from");
  checkpoint_wrapped_module_ = value;
}

void FSDPModule::for_each_state(bool recurse, const std::function<void(detail::FSDPState&)>& f) {
  f(*state_);
  if (!recurse) return;
  for (const auto& m : module_->modules())
    if (auto* unit = dynamic_cast<FSDPModule*>(m.get())) unit->for_each_state(false, f);
}

namespace {
// A setter of every parameter group among the states for_each_state visits.
template <typename Set>
std::function<void(detail::FSDPState&)> on_param_group(Set set) {
  return [set](detail::FSDPState& s) {
    if (auto* g = s.param_group()) set(*g);
  };
}
}  // namespace

void FSDPModule::set_reshard_after_forward(bool value, bool recurse) {
  for_each_state(recurse, on_param_group([&](detail::FSDPParamGroup& g) { g.set_reshard_after_forward(value); }));
}

void FSDPModule::set_requires_gradient_sync(bool value, bool recurse) {
  for_each_state(recurse, on_param_group([&](detail::FSDPParamGroup& g) { g.set_requires_gradient_sync(value); }));
}

void FSDPModule::set_requires_all_reduce(bool value, bool recurse) {
  for_each_state(recurse, on_param_group([&](detail::FSDPParamGroup& g) { g.set_requires_all_reduce(value); }));
}

void FSDPModule::set_reshard_after_backward(bool value, bool recurse) {
  for_each_state(recurse, on_param_group([&](detail::FSDPParamGroup& g) { g.set_reshard_after_backward(value); }));
}

std::vector<std::weak_ptr<detail::FSDPState>> FSDPModule::states_of(const std::vector<std::shared_ptr<FSDPModule>>& modules) {
  std::vector<std::weak_ptr<detail::FSDPState>> states;
  for (const auto& m : modules) {
    if (!m) throw Error("set_modules_to_*_prefetch: a module is null");
    states.push_back(m->state_);
  }
  return states;
}

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<std::shared_ptr<FSDPModule>>& modules) {
  state_->set_forward_prefetch(states_of(modules));
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<std::shared_ptr<FSDPModule>>& modules) {
  state_->set_backward_prefetch(states_of(modules));
}

const ProcessGroup& FSDPModule::process_group() const { return state_->process_group(); }

ReshardPolicy FSDPModule::reshard_after_forward() const {
  const auto* g = state_->param_group();
  return g ? g->reshard_policy() : ReshardPolicy(false);
}

bool FSDPModule::is_root() const { return state_->is_root(); }

std::vector<std::string> FSDPModule::sharded_parameter_names() const {
  std::vector<std::string> names;
  if (const auto* g = state_->param_group())
    for (const auto& p : g->fsdp_params()) names.push_back(p.fqn());
  return names;
}

int64_t FSDPModule::unsharded_padded_numel() const {
  const auto* g = state_->param_group();
  return g ? g->unsharded_numel() : 0;
}

at::Device FSDPModule::compute_device() const { return state_->compute_device(); }

bool FSDPModule::has_deferred_parameters() const {
  const auto* g = state_->param_group();
  return g && g->deferred();
}

void FSDPModule::materialize_parameters(const std::function<void()>& init) {
  if (auto* g = state_->param_group()) g->materialize(init);
}

void FSDPModule::mark_parameters_materialized() {
  if (auto* g = state_->param_group()) g->mark_materialized();
}

std::vector<ShardedParameter> FSDPModule::sharded_parameters() const {
  std::vector<ShardedParameter> out;
  if (const auto* g = state_->param_group())
    for (const auto& p : g->fsdp_params()) out.push_back({p.fqn(), p.param(), p.sharded_view(), p.layout()});
  return out;
}

std::vector<at::Tensor> FSDPModule::full_parameters() const {
  const auto* g = state_->param_group();
  return g ? g->full_values() : std::vector<at::Tensor>{};
}

ShardedTensor FSDPModule::flat_parameter() const {
  const auto* g = state_->param_group();
  if (!g) throw Error("FSDP unit " + state_->name() + " shards no parameters: it has no flat parameter");
  return g->flat_value();
}

std::vector<at::Tensor> FSDPModule::local_rows_from_flat_parameter(const ShardedTensor& flat) const {
  const auto* g = state_->param_group();
  if (!g) throw Error("FSDP unit " + state_->name() + " shards no parameters: it has no flat parameter");
  return g->local_rows_from_flat(flat);
}

void FSDPModule::set_is_last_backward(bool value) {
  for (const auto& m : modules())
    if (auto* f = dynamic_cast<FSDPModule*>(m.get())) f->state_->set_is_last_backward(value);
}

// ---------------------------------------------------------------------------------------------
// summon_full_params

FullParamsGuard::FullParamsGuard(torch::nn::Module& module, bool writeback) : writeback_(writeback) {
  std::vector<std::shared_ptr<detail::FSDPState>> units;
  for (const auto& m : module.modules())
    if (auto* f = dynamic_cast<FSDPModule*>(m.get()))
      if (f->state_->param_group()) units.push_back(f->state_);
  // Every unit checked before any changes: an error leaves the model as it was.
  for (auto& s : units) {
    auto* g = s->param_group();
    // Already full in the parameters' own dtype: used as it is (edits written back on exit).
    if (g->is_unsharded() && !g->unsharded_below_full_precision()) {
      already_full_.push_back(s);
      continue;
    }
    if (s->in_forward_or_backward())
      throw Error("summon_full_params: FSDP unit " + s->name() + " is in forward or backward");
    states_.push_back(s);
  }
  for (auto& s : states_) {
    auto* g = s->param_group();
    // Gathered for compute in a lower precision (a mixed-precision policy's param_dtype): the
    // summoned parameters are the full-precision ones, as FSDP1's; the compute copy is gathered
    // again when the guard ends. A gather in flight (an async unshard, a prefetch nobody used)
    // is in the compute dtype too: finished and dropped first.
    if (g->is_unsharded()) {
      g->reshard();
      regather_.push_back(s);
    }
    g->drop_pending_unshard();
  }
  // All gathers in flight, then wait; in the parameters' own dtype, as FSDP1 summons them.
  for (auto& s : states_) s->param_group()->unshard(detail::UnshardFor::kFullPrecision);
  for (auto& s : states_) s->param_group()->wait_for_unshard();
}

FullParamsGuard::~FullParamsGuard() {
  // A destructor must not throw: an error here (a failed gather) is left to the next forward,
  // which gathers again. While an exception unwinds, peers may not be here: no collective then.
  try {
    for (auto& s : states_) {
      auto* g = s->param_group();
      if (writeback_) g->write_back_unsharded();
      g->reshard();
    }
    for (auto& s : already_full_)
      if (writeback_) s->param_group()->write_back_unsharded();
    if (std::uncaught_exceptions() > 0) return;
    for (auto& s : regather_) {
      s->param_group()->unshard();
      s->param_group()->wait_for_unshard();
    }
  } catch (...) {
  }
}

FullParamsGuard summon_full_params(torch::nn::Module& module, bool writeback) {
  return FullParamsGuard(module, writeback);
}

}  // namespace fsdpp
