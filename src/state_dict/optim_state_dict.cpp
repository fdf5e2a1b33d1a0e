// Optimizer state dicts keyed by parameter names: libtorch's per-parameter state (keyed by
// TensorImpl address) to and from PyTorch-named entries, gathered or sharded like the
// parameters FSDP shards.
#include <fsdpp/state_dict.h>

#include <algorithm>
#include <cstring>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Type.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>
#include <fsdpp/model_layout.h>

#include "common/shape_string.h"
#include "compat/optimizer_state_key.h"
#include "optim/optimizer_state.h"
#include "optim/optimizer_traits.h"

namespace fsdpp {
namespace {

using torch::optim::OptimizerParamState;
using detail::OptimizerStateTraits;

// Which model entry (plain key, FSDP parameter) each optimizer parameter is.
struct ParamInfo {
  std::string key;
  const ModelLayout::Entry* entry = nullptr;
};

std::unordered_map<const c10::TensorImpl*, ParamInfo> params_by_impl(const ModelLayout& layout) {
  std::unordered_map<const c10::TensorImpl*, ParamInfo> out;
  for (const auto& e : layout.entries)
    if (!e.is_buffer) out.emplace(e.tensor.unsafeGetTensorImpl(), ParamInfo{e.key, &e});  // first key wins
  return out;
}

const ParamInfo& info_of(const std::unordered_map<const c10::TensorImpl*, ParamInfo>& by_impl, const at::Tensor& p,
                         size_t group, size_t index, const std::string& api) {
  auto it = by_impl.find(p.unsafeGetTensorImpl());
  if (it == by_impl.end())
    throw Error(api + ": parameter " + std::to_string(index) + " of the optimizer's param group " + std::to_string(group) +
                " (shape " + detail::shape_string(p.sizes()) + ") is not a parameter of the model");
  return it->second;
}

const ProcessGroup& group_of(const ModelLayout::Entry& e) { return e.layout->process_group(); }

// ---- set_optimizer_state_dict: check, plan, resolve, commit --------------------------------
// The shape of checkpoint::load: nothing is written until every entry has been checked and
// every new state built.

// One parameter of the optimizer and the state dict's entries for it (null: it has none).
struct PlannedParam {
  compat::OptimizerStateKey state_key;
  const ModelLayout::Entry* entry;
  const StateDict* entries;
};

// What set_optimizer_state_dict will write: the parameters in the optimizer's order, and each
// group's new options.
struct LoadPlan {
  std::vector<PlannedParam> params;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
};

// Check: refuse what this function cannot load at all.
void check_request(const OptimizerStateDict& sd, const StateDictOptions& options, const std::string& api) {
  if (sd.rank0_only_placeholder)
    throw Error(api + ": this rank was given the empty dict that a FULL optimizer state dict with cpu_offload gives "
                "ranks other than 0; load rank 0's dict (e.g. from its file) on every rank");
  if (options.broadcast_from_rank0())
    throw Error(api + ": broadcast_from_rank0 is not supported for optimizer state dicts; load rank 0's dict on every rank");
}

// Group g of the dict must list the same parameter keys as the optimizer's group (any order).
void check_group_keys(std::vector<std::string> keys, std::vector<std::string> given, size_t g, const std::string& api) {
  std::sort(keys.begin(), keys.end());
  std::sort(given.begin(), given.end());
  if (keys == given) return;
  std::string missing, unexpected;
  for (const auto& k : keys)
    if (!std::binary_search(given.begin(), given.end(), k)) missing += " '" + k + "'";
  for (const auto& k : given)
    if (!std::binary_search(keys.begin(), keys.end(), k)) unexpected += " '" + k + "'";
  throw Error(api + ": param group " + std::to_string(g) + " differs from the optimizer's: missing" +
              (missing.empty() ? " none" : missing) + "; unexpected" + (unexpected.empty() ? " none" : unexpected));
}

// Group g's options in the optimizer's own type: typed when the dict holds that type, else
// parsed from the dict's bytes.
std::unique_ptr<torch::optim::OptimizerOptions> options_for(const OptimizerStateDict::ParamGroup& given,
                                                            const torch::optim::OptimizerOptions& current, size_t g,
                                                            const std::string& api) {
  if (given.options && typeid(*given.options) == typeid(current)) return given.options->clone();
  if (given.options_bytes.empty())
    throw Error(api + ": param group " + std::to_string(g) + " holds " + c10::demangle(typeid(*given.options).name()) +
                " but the optimizer uses " + c10::demangle(typeid(current).name()));
  try {
    return detail::options_from_bytes(current, given.options_bytes);
  } catch (const c10::Error& e) {
    throw Error(api + ": param group " + std::to_string(g) + "'s options do not read as " +
                c10::demangle(typeid(current).name()) + ": " + e.what_without_backtrace());
  }
}

// Plan: the optimizer's parameters matched to the dict's keys, group by group, and the options.
// Local; throws before anything changed.
LoadPlan plan_load(const torch::optim::Optimizer& optim, const OptimizerStateDict& sd,
                   const std::unordered_map<const c10::TensorImpl*, ParamInfo>& by_impl, const std::string& api) {
  if (sd.param_groups.size() != optim.param_groups().size())
    throw Error(api + ": the state dict has " + std::to_string(sd.param_groups.size()) +
                " param groups but the optimizer has " + std::to_string(optim.param_groups().size()));
  LoadPlan plan;
  std::unordered_set<std::string> optimizer_keys;
  for (size_t g = 0; g < optim.param_groups().size(); ++g) {
    const auto& group = optim.param_groups()[g];
    std::vector<std::string> keys;
    for (size_t i = 0; i < group.params().size(); ++i) {
      const ParamInfo& info = info_of(by_impl, group.params()[i], g, i, api);
      keys.push_back(info.key);
      optimizer_keys.insert(info.key);
      auto st = sd.state.find(info.key);
      plan.params.push_back({compat::optimizer_state_key(group.params()[i]), info.entry,
                             st == sd.state.end() ? nullptr : &st->second});
    }
    check_group_keys(std::move(keys), sd.param_groups[g].params, g, api);
    if (!sd.param_groups[g].options && sd.param_groups[g].options_bytes.empty())
      throw Error(api + ": param group " + std::to_string(g) + " of the state dict has no options");
  }
  for (const auto& [key, entries] : sd.state)
    if (!optimizer_keys.count(key)) throw Error(api + ": the state dict has state for '" + key + "', which is no parameter of the optimizer");
  for (size_t g = 0; g < optim.param_groups().size(); ++g)
    plan.options.push_back(options_for(sd.param_groups[g], optim.param_groups()[g].options(), g, api));
  return plan;
}

// Every entry's name and shape against the optimizer and the current model. Local.
void check_entries(const LoadPlan& plan, const OptimizerStateTraits& traits, const torch::optim::Optimizer& optim,
                   const std::string& api) {
  const auto& names = traits.entries;
  for (const auto& pl : plan.params) {
    if (!pl.entries) continue;
    const std::string& key = pl.entry->key;
    for (const auto& [name, value] : *pl.entries) {
      if (name == "step" && traits.has_step) {
        if (!value.is_tensor() || value.tensor().numel() != 1)
          throw Error(api + ": '" + key + "' entry 'step' must be a one-element tensor");
        continue;
      }
      if (std::find(names.begin(), names.end(), name) == names.end())
        throw Error(api + ": '" + key + "' has state entry '" + name + "', which " + c10::demangle(typeid(optim).name()) +
                    " does not keep");
      const std::vector<int64_t> expected =
          pl.entry->layout ? pl.entry->layout->global_shape() : pl.entry->tensor.sizes().vec();
      if (value.sizes() != expected)
        throw Error(api + ": size mismatch for '" + key + "' entry '" + name + "': the state dict has shape " +
                    detail::shape_string(value.sizes()) + ", the parameter in the current model has " +
                    detail::shape_string(expected));
      if (value.is_sharded() && !pl.entry->layout)
        throw Error(api + ": '" + key + "' entry '" + name + "' is a ShardedTensor but the model holds '" + key + "' whole");
    }
    for (const auto& name : traits.required)
      if (!pl.entries->contains(name)) throw Error(api + ": '" + key + "' has no state entry '" + name + "'");
  }
}

// Resolve: each parameter's new state from this rank's rows of the dict's entries. Taking rows
// from a ShardedTensor sharded unlike the model is collective over the unit's group; every rank
// walks the same optimizer order, so those collectives line up.
std::vector<std::pair<compat::OptimizerStateKey, std::unique_ptr<OptimizerParamState>>> resolve(
    const LoadPlan& plan, const OptimizerStateTraits& traits) {
  const auto& names = traits.entries;
  std::vector<std::pair<compat::OptimizerStateKey, std::unique_ptr<OptimizerParamState>>> states;
  at::NoGradGuard no_grad;
  for (const auto& pl : plan.params) {
    if (!pl.entries) continue;
    const ModelLayout::Entry& e = *pl.entry;
    std::vector<at::Tensor> tensors(names.size());
    for (size_t j = 0; j < names.size(); ++j) {
      const StateDictValue* v = pl.entries->find(names[j]);
      if (!v) continue;
      at::Tensor local;
      if (!e.layout) {
        local = v->tensor().detach().clone();
      } else {
        const TensorLayout& layout = *e.layout;
        local = v->is_sharded() ? layout.local_from(v->sharded_tensor()) : layout.local_of_full(v->tensor());
        local = local.contiguous().clone();
      }
      tensors[j] = local.to(e.tensor.options().requires_grad(false));
    }
    const StateDictValue* step = pl.entries->find("step");
    const int64_t s = step ? step->tensor().reshape({}).item<int64_t>() : 0;
    states.emplace_back(pl.state_key, traits.make(tensors, s));
  }
  return states;
}

// Commit: the options, then the whole state (a parameter the dict has no state for loses its own).
void commit(torch::optim::Optimizer& optim, LoadPlan& plan,
            std::vector<std::pair<compat::OptimizerStateKey, std::unique_ptr<OptimizerParamState>>> states) {
  for (size_t g = 0; g < plan.options.size(); ++g) optim.param_groups()[g].set_options(std::move(plan.options[g]));
  for (const auto& pl : plan.params) optim.state().erase(pl.state_key);
  for (auto& [key, st] : states) optim.state()[key] = std::move(st);
}

// ---- get_optimizer_state_dict: look up, agree, build ------------------------------------------

// One parameter of the optimizer and its state, looked up once.
struct ParamRecord {
  const ParamInfo* info;
  const OptimizerParamState* st;
  std::vector<at::Tensor> tensors;
  int64_t step;
  std::vector<int64_t> flags;  // sharded parameters: has a state, step, which tensors exist
};
using ParamRecords = std::vector<std::vector<ParamRecord>>;  // by param group, then index

ParamRecords look_up_states(const torch::optim::Optimizer& optim, const OptimizerStateTraits& traits,
                            const std::unordered_map<const c10::TensorImpl*, ParamInfo>& by_impl,
                            const std::string& api) {
  ParamRecords records(optim.param_groups().size());
  for (size_t g = 0; g < optim.param_groups().size(); ++g)
    for (size_t i = 0; i < optim.param_groups()[g].params().size(); ++i) {
      const at::Tensor& p = optim.param_groups()[g].params()[i];
      const OptimizerParamState* st = detail::find_param_state(optim, p);
      ParamRecord& r = records[g].emplace_back(ParamRecord{
          &info_of(by_impl, p, g, i, api), st, st ? traits.tensors(*st) : std::vector<at::Tensor>(traits.entries.size()),
          st ? traits.step(*st) : 0, {}});
      if (!r.info->entry->layout) continue;
      r.flags = {st ? 1 : 0, r.step};
      for (const auto& t : r.tensors) r.flags.push_back(t.defined() ? 1 : 0);
    }
  return records;
}

// The ranks agree, for each sharded parameter, on whether it has a state (a rank holding no
// rows may have none), on its step and on which tensors exist, so that every rank joins the
// same gathers after: one MAX all_reduce per process group, over all its parameters at once.
void agree_on_flags(ParamRecords& records) {
  struct GroupFlags {
    const ProcessGroup* group;
    std::vector<std::vector<int64_t>*> members;
  };
  std::vector<GroupFlags> groups;
  for (auto& group_records : records)
    for (ParamRecord& r : group_records) {
      const ModelLayout::Entry& e = *r.info->entry;
      if (!e.layout) continue;
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const GroupFlags& f) { return &f.group->impl() == &group_of(e).impl(); });
      if (it == groups.end()) it = groups.insert(groups.end(), GroupFlags{&group_of(e), {}});
      it->members.push_back(&r.flags);
    }
  for (const GroupFlags& f : groups) {
    if (f.group->size() == 1) continue;
    std::vector<int64_t> all;
    for (const auto* flags : f.members) all.insert(all.end(), flags->begin(), flags->end());
    at::Tensor t = at::tensor(all, at::kLong);
    all_reduce(t, ReduceOp::MAX, *f.group);
    const int64_t* v = t.data_ptr<int64_t>();
    for (auto* flags : f.members)
      for (auto& flag : *flags) flag = *v++;
  }
}

// A sharded parameter's entries (the agreed flags say which): FULL gathers each whole, SHARDED
// keeps it a ShardedTensor; a rank without a tensor the others have joins with zeros.
StateDict sharded_entries(const ParamRecord& r, const at::Tensor& p, const OptimizerStateTraits& traits, bool full,
                          bool offload) {
  const ModelLayout::Entry& e = *r.info->entry;
  const TensorLayout& layout = *e.layout;
  const int rank = group_of(e).rank();
  StateDict entries;
  if (traits.has_step) entries.insert("step", at::scalar_tensor(r.flags[1], at::kLong));
  for (size_t j = 0; j < traits.entries.size(); ++j) {
    if (r.flags[2 + j] == 0) continue;
    at::Tensor local = r.tensors[j].defined() ? r.tensors[j]
                                              : at::zeros(layout.local_shape(rank), p.options().requires_grad(false));
    ShardedTensor sharded = layout.to_sharded_tensor(local, /*copy=*/!full);
    if (full) {
      at::Tensor whole = sharded.full_tensor();
      entries.insert(traits.entries[j], offload ? whole.to(at::kCPU) : whole);
    } else {
      entries.insert(traits.entries[j], offload ? sharded.cpu() : sharded);
    }
  }
  return entries;
}

// A parameter held whole: copies of its state's tensors.
StateDict whole_entries(const ParamRecord& r, const OptimizerStateTraits& traits, bool offload) {
  StateDict entries;
  if (traits.has_step) entries.insert("step", at::scalar_tensor(r.step, at::kLong));
  for (size_t j = 0; j < traits.entries.size(); ++j)
    if (r.tensors[j].defined()) {
      at::Tensor c = r.tensors[j].detach().clone();
      entries.insert(traits.entries[j], offload ? c.to(at::kCPU) : c);
    }
  return entries;
}

// What a FULL dict with cpu_offload gives ranks other than 0 (PyTorch's rank0_only).
bool rank0_only_placeholder_here() {
  int rank = 0;
  try {
    rank = default_group().rank();
  } catch (const Error&) {
  }
  return rank != 0;
}

}  // namespace

OptimizerStateDict get_optimizer_state_dict(torch::nn::Module& model, const torch::optim::Optimizer& optim,
                                            const StateDictOptions& options) {
  const std::string api = "get_optimizer_state_dict";
  const OptimizerStateTraits& traits = detail::optimizer_state_traits(optim);
  const bool full = options.full_state_dict(), offload = options.cpu_offload();
  at::NoGradGuard no_grad;
  const ModelLayout layout(model);
  const auto by_impl = params_by_impl(layout);  // `records` point into it
  ParamRecords records = look_up_states(optim, traits, by_impl, api);
  agree_on_flags(records);

  OptimizerStateDict sd;
  sd.type = full ? StateDictType::FULL_STATE_DICT : StateDictType::SHARDED_STATE_DICT;
  for (size_t g = 0; g < optim.param_groups().size(); ++g) {
    const auto& group = optim.param_groups()[g];
    OptimizerStateDict::ParamGroup out;
    out.options = std::shared_ptr<torch::optim::OptimizerOptions>(group.options().clone());
    for (size_t i = 0; i < group.params().size(); ++i) {
      const ParamRecord& r = records[g][i];
      out.params.push_back(r.info->key);
      if (r.info->entry->layout) {
        if (r.flags[0] != 0) sd.state.emplace(r.info->key, sharded_entries(r, group.params()[i], traits, full, offload));
      } else if (r.st) {
        sd.state.emplace(r.info->key, whole_entries(r, traits, offload));
      }
    }
    sd.param_groups.push_back(std::move(out));
  }
  if (full && offload && rank0_only_placeholder_here()) {
    OptimizerStateDict empty;
    empty.type = sd.type;
    empty.rank0_only_placeholder = true;
    return empty;
  }
  return sd;
}

void set_optimizer_state_dict(torch::nn::Module& model, torch::optim::Optimizer& optim, const OptimizerStateDict& sd,
                              const StateDictOptions& options) {
  const std::string api = "set_optimizer_state_dict";
  check_request(sd, options, api);
  const OptimizerStateTraits& traits = detail::optimizer_state_traits(optim);
  const ModelLayout layout(model);
  LoadPlan plan = plan_load(optim, sd, params_by_impl(layout), api);
  check_entries(plan, traits, optim, api);
  commit(optim, plan, resolve(plan, traits));
}

void init_optimizer_state(torch::optim::Optimizer& optim) {
  const OptimizerStateTraits& traits = detail::optimizer_state_traits(optim);
  at::NoGradGuard no_grad;
  for (auto& group : optim.param_groups())
    for (const auto& p : group.params()) {
      const auto key = compat::optimizer_state_key(p);
      if (optim.state().count(key)) continue;
      std::vector<at::Tensor> initial = traits.initial(group.options(), p);
      if (!initial.empty()) optim.state()[key] = traits.make(initial, 0);
    }
}

StateDict flatten_optimizer_state(const OptimizerStateDict& osd) {
  StateDict flat;
  flat.type = osd.type;
  for (const auto& [key, entries] : osd.state)
    for (const auto& [name, value] : entries) flat.insert("state." + key + "." + name, value);
  return flat;
}

}  // namespace fsdpp
