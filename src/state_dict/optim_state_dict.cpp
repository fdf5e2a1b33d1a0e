// Optimizer state dicts keyed by parameter names: libtorch's per-parameter state (keyed by
// TensorImpl address) to and from PyTorch-named entries, gathered or sharded like the
// parameters FSDP shards.
#include <fsdpp/optim_state_dict.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Type.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "common/shape_string.h"
#include "compat/optimizer_state_key.h"
#include "state_dict/fsdp_layout.h"

namespace fsdpp {
namespace {

using torch::optim::OptimizerParamState;

// What an optimizer keeps per parameter: tensor entries shaped like the parameter, and a step.
enum class Kind { kSGD, kAdam, kAdamW, kAdagrad, kRMSprop };

Kind kind_of(const torch::optim::Optimizer& o) {
  if (dynamic_cast<const torch::optim::Adam*>(&o)) return Kind::kAdam;
  if (dynamic_cast<const torch::optim::AdamW*>(&o)) return Kind::kAdamW;
  if (dynamic_cast<const torch::optim::SGD*>(&o)) return Kind::kSGD;
  if (dynamic_cast<const torch::optim::Adagrad*>(&o)) return Kind::kAdagrad;
  if (dynamic_cast<const torch::optim::RMSprop*>(&o)) return Kind::kRMSprop;
  throw Error("optimizer state dicts: unsupported optimizer " + c10::demangle(typeid(o).name()) +
              " (supported: SGD, Adam, AdamW, Adagrad, RMSprop)");
}

const std::vector<std::string>& tensor_entry_names(Kind k) {
  static const std::vector<std::string> sgd{"momentum_buffer"}, adam{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
      adagrad{"sum"}, rmsprop{"square_avg", "momentum_buffer", "grad_avg"};
  switch (k) {
    case Kind::kSGD: return sgd;
    case Kind::kAdam:
    case Kind::kAdamW: return adam;
    case Kind::kAdagrad: return adagrad;
    default: return rmsprop;
  }
}
bool has_step(Kind k) { return k != Kind::kSGD; }
// The entries a parameter's state cannot do without.
std::vector<std::string> required_entry_names(Kind k) {
  switch (k) {
    case Kind::kSGD: return {"momentum_buffer"};
    case Kind::kAdam:
    case Kind::kAdamW: return {"exp_avg", "exp_avg_sq"};
    case Kind::kAdagrad: return {"sum"};
    default: return {"square_avg"};
  }
}

template <typename S>
const S& as(const OptimizerParamState& s) {
  return static_cast<const S&>(s);
}

// Entry i of tensor_entry_names(k) (undefined when the optimizer did not create it), and step.
std::vector<at::Tensor> tensor_entries(Kind k, const OptimizerParamState& s) {
  switch (k) {
    case Kind::kSGD: return {as<torch::optim::SGDParamState>(s).momentum_buffer()};
    case Kind::kAdam: {
      const auto& a = as<torch::optim::AdamParamState>(s);
      return {a.exp_avg(), a.exp_avg_sq(), a.max_exp_avg_sq()};
    }
    case Kind::kAdamW: {
      const auto& a = as<torch::optim::AdamWParamState>(s);
      return {a.exp_avg(), a.exp_avg_sq(), a.max_exp_avg_sq()};
    }
    case Kind::kAdagrad: return {as<torch::optim::AdagradParamState>(s).sum()};
    default: {
      const auto& r = as<torch::optim::RMSpropParamState>(s);
      return {r.square_avg(), r.momentum_buffer(), r.grad_avg()};
    }
  }
}

int64_t step_of(Kind k, const OptimizerParamState& s) {
  switch (k) {
    case Kind::kAdam: return as<torch::optim::AdamParamState>(s).step();
    case Kind::kAdamW: return as<torch::optim::AdamWParamState>(s).step();
    case Kind::kAdagrad: return as<torch::optim::AdagradParamState>(s).step();
    case Kind::kRMSprop: return as<torch::optim::RMSpropParamState>(s).step();
    default: return 0;
  }
}

std::unique_ptr<OptimizerParamState> make_state(Kind k, const std::vector<at::Tensor>& t, int64_t step) {
  switch (k) {
    case Kind::kSGD: {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(t[0]);
      return s;
    }
    case Kind::kAdam: {
      auto s = std::make_unique<torch::optim::AdamParamState>();
      s->step(step);
      s->exp_avg(t[0]);
      s->exp_avg_sq(t[1]);
      s->max_exp_avg_sq(t[2]);
      return s;
    }
    case Kind::kAdamW: {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step);
      s->exp_avg(t[0]);
      s->exp_avg_sq(t[1]);
      s->max_exp_avg_sq(t[2]);
      return s;
    }
    case Kind::kAdagrad: {
      auto s = std::make_unique<torch::optim::AdagradParamState>();
      s->step(step);
      s->sum(t[0]);
      return s;
    }
    default: {
      auto s = std::make_unique<torch::optim::RMSpropParamState>();
      s->step(step);
      s->square_avg(t[0]);
      s->momentum_buffer(t[1]);
      s->grad_avg(t[2]);
      return s;
    }
  }
}

// Which model entry (plain key, FSDP parameter) each optimizer parameter is.
struct ParamInfo {
  std::string key;
  const detail::ModelEntry* entry = nullptr;
};

std::unordered_map<const c10::TensorImpl*, ParamInfo> params_by_impl(const detail::ModelLayout& layout) {
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

const ProcessGroup& group_of(const detail::ModelEntry& e) { return e.unit->fsdp_state()->param_group()->process_group(); }

}  // namespace

std::string OptimStateDict::ParamGroup::serialized_options() const {
  if (!options) return options_bytes;
  torch::serialize::OutputArchive archive;
  options->serialize(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

OptimStateDict get_optimizer_state_dict(torch::nn::Module& model, const torch::optim::Optimizer& optim,
                                        const StateDictOptions& options) {
  const std::string api = "get_optimizer_state_dict";
  const Kind kind = kind_of(optim);
  const bool full = options.full_state_dict_, offload = options.cpu_offload_;
  at::NoGradGuard no_grad;
  detail::ModelLayout layout = detail::collect_layout(model);
  auto by_impl = params_by_impl(layout);
  const auto& names = tensor_entry_names(kind);

  OptimStateDict sd;
  sd.type = full ? StateDictType::FULL_STATE_DICT : StateDictType::SHARDED_STATE_DICT;
  for (size_t g = 0; g < optim.param_groups().size(); ++g) {
    const auto& group = optim.param_groups()[g];
    OptimStateDict::ParamGroup out;
    out.options = std::shared_ptr<torch::optim::OptimizerOptions>(group.options().clone());
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const ParamInfo& info = info_of(by_impl, p, g, i, api);
      out.params.push_back(info.key);
      auto it = optim.state().find(compat::optimizer_state_key(p));
      const OptimizerParamState* st = it == optim.state().end() ? nullptr : it->second.get();
      const detail::ModelEntry& e = *info.entry;
      std::vector<at::Tensor> tensors = st ? tensor_entries(kind, *st) : std::vector<at::Tensor>(names.size());
      int64_t step = st ? step_of(kind, *st) : 0;
      if (e.fsdp_param) {
        // The ranks agree on which entries exist (a rank holding no rows may have none) and on
        // the step, so every rank joins the same gathers.
        std::vector<int64_t> flags{st ? 1 : 0, step};
        for (const auto& t : tensors) flags.push_back(t.defined() ? 1 : 0);
        at::Tensor agreed = at::tensor(flags, at::kLong);
        if (group_of(e).size() > 1) all_reduce(agreed, ReduceOp::MAX, group_of(e));
        if (agreed[0].item<int64_t>() == 0) continue;
        step = agreed[1].item<int64_t>();
        const int rank = group_of(e).rank();
        StateDict entries;
        if (has_step(kind)) entries.insert("step", at::scalar_tensor(step, at::kLong));
        for (size_t j = 0; j < names.size(); ++j) {
          if (agreed[2 + static_cast<int64_t>(j)].item<int64_t>() == 0) continue;
          at::Tensor local = tensors[j].defined()
                                 ? tensors[j]
                                 : at::zeros(detail::sharded_size_of(*e.fsdp_param, rank), p.options().requires_grad(false));
          ShardedTensor sharded = detail::to_sharded(*e.fsdp_param, local, group_of(e), /*copy=*/!full);
          if (full) {
            at::Tensor whole = sharded.full_tensor();
            entries.insert(names[j], offload ? whole.to(at::kCPU) : whole);
          } else {
            entries.insert(names[j], offload ? sharded.cpu() : sharded);
          }
        }
        sd.state.emplace(info.key, std::move(entries));
      } else if (st) {
        StateDict entries;
        if (has_step(kind)) entries.insert("step", at::scalar_tensor(step, at::kLong));
        for (size_t j = 0; j < names.size(); ++j)
          if (tensors[j].defined()) {
            at::Tensor c = tensors[j].detach().clone();
            entries.insert(names[j], offload ? c.to(at::kCPU) : c);
          }
        sd.state.emplace(info.key, std::move(entries));
      }
    }
    sd.param_groups.push_back(std::move(out));
  }
  if (full && offload) {
    int rank = 0;
    try {
      rank = default_group().rank();
    } catch (const Error&) {
    }
    if (rank != 0) {
      OptimStateDict empty;
      empty.type = sd.type;
      empty.rank0_only_placeholder = true;
      return empty;
    }
  }
  return sd;
}

void set_optimizer_state_dict(torch::nn::Module& model, torch::optim::Optimizer& optim, const OptimStateDict& sd,
                              const StateDictOptions& options) {
  const std::string api = "set_optimizer_state_dict";
  if (sd.rank0_only_placeholder)
    throw Error(api + ": this rank was given the empty dict that a FULL optimizer state dict with cpu_offload gives "
                "ranks other than 0; load rank 0's dict (e.g. from its file) on every rank");
  if (options.broadcast_from_rank0_)
    throw Error(api + ": broadcast_from_rank0 is not supported for optimizer state dicts; load rank 0's dict on every rank");
  const Kind kind = kind_of(optim);
  const auto& names = tensor_entry_names(kind);
  detail::ModelLayout layout = detail::collect_layout(model);
  auto by_impl = params_by_impl(layout);

  // Param groups: the same parameters (by key) in the same groups.
  if (sd.param_groups.size() != optim.param_groups().size())
    throw Error(api + ": the state dict has " + std::to_string(sd.param_groups.size()) +
                " param groups but the optimizer has " + std::to_string(optim.param_groups().size()));
  struct Planned {
    compat::OptimizerStateKey state_key;
    const detail::ModelEntry* entry;
    const StateDict* entries;
  };
  std::vector<Planned> planned;
  std::unordered_set<std::string> optimizer_keys;
  for (size_t g = 0; g < optim.param_groups().size(); ++g) {
    const auto& group = optim.param_groups()[g];
    std::vector<std::string> keys;
    for (size_t i = 0; i < group.params().size(); ++i) {
      const ParamInfo& info = info_of(by_impl, group.params()[i], g, i, api);
      keys.push_back(info.key);
      optimizer_keys.insert(info.key);
      auto st = sd.state.find(info.key);
      planned.push_back({compat::optimizer_state_key(group.params()[i]), info.entry,
                         st == sd.state.end() ? nullptr : &st->second});
    }
    std::vector<std::string> given = sd.param_groups[g].params;
    std::sort(keys.begin(), keys.end());
    std::sort(given.begin(), given.end());
    if (keys != given) {
      std::string missing, unexpected;
      for (const auto& k : keys)
        if (!std::binary_search(given.begin(), given.end(), k)) missing += " '" + k + "'";
      for (const auto& k : given)
        if (!std::binary_search(keys.begin(), keys.end(), k)) unexpected += " '" + k + "'";
      throw Error(api + ": param group " + std::to_string(g) + " differs from the optimizer's: missing" +
                  (missing.empty() ? " none" : missing) + "; unexpected" + (unexpected.empty() ? " none" : unexpected));
    }
    if (!sd.param_groups[g].options && sd.param_groups[g].options_bytes.empty())
      throw Error(api + ": param group " + std::to_string(g) + " of the state dict has no options");
  }
  for (const auto& [key, entries] : sd.state)
    if (!optimizer_keys.count(key)) throw Error(api + ": the state dict has state for '" + key + "', which is no parameter of the optimizer");

  // Options: typed when of the optimizer's own type, else parsed from bytes.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> new_options;
  for (size_t g = 0; g < optim.param_groups().size(); ++g) {
    const auto& given = sd.param_groups[g];
    const auto& current = optim.param_groups()[g].options();
    if (given.options && typeid(*given.options) == typeid(current)) {
      new_options.push_back(given.options->clone());
      continue;
    }
    if (given.options_bytes.empty())
      throw Error(api + ": param group " + std::to_string(g) + " holds " + c10::demangle(typeid(*given.options).name()) +
                  " but the optimizer uses " + c10::demangle(typeid(current).name()));
    auto parsed = current.clone();
    try {
      torch::serialize::InputArchive archive;
      std::istringstream in(given.options_bytes);
      archive.load_from(in);
      parsed->serialize(archive);
    } catch (const c10::Error& e) {
      throw Error(api + ": param group " + std::to_string(g) + "'s options do not read as " +
                  c10::demangle(typeid(current).name()) + ": " + e.what_without_backtrace());
    }
    new_options.push_back(std::move(parsed));
  }

  // Check every entry (no communication, nothing written yet).
  for (const auto& pl : planned) {
    if (!pl.entries) continue;
    const std::string& key = pl.entry->key;
    for (const auto& [name, value] : *pl.entries) {
      if (name == "step" && has_step(kind)) {
        if (!value.is_tensor() || value.tensor().numel() != 1)
          throw Error(api + ": '" + key + "' entry 'step' must be a one-element tensor");
        continue;
      }
      if (std::find(names.begin(), names.end(), name) == names.end())
        throw Error(api + ": '" + key + "' has state entry '" + name + "', which " + c10::demangle(typeid(optim).name()) +
                    " does not keep");
      const std::vector<int64_t> expected =
          pl.entry->fsdp_param ? pl.entry->fsdp_param->unsharded_size() : pl.entry->tensor.sizes().vec();
      if (value.sizes() != expected)
        throw Error(api + ": size mismatch for '" + key + "' entry '" + name + "': the state dict has shape " +
                    detail::shape_string(value.sizes()) + ", the parameter in the current model has " +
                    detail::shape_string(expected));
      if (value.is_sharded() && !pl.entry->fsdp_param)
        throw Error(api + ": '" + key + "' entry '" + name + "' is a ShardedTensor but the model holds '" + key + "' whole");
    }
    for (const auto& name : required_entry_names(kind))
      if (!pl.entries->contains(name)) throw Error(api + ": '" + key + "' has no state entry '" + name + "'");
  }

  // Build the new states (redistribution, if any, is collective: module order on every rank).
  std::vector<std::pair<compat::OptimizerStateKey, std::unique_ptr<OptimizerParamState>>> states;
  {
    at::NoGradGuard no_grad;
    for (const auto& pl : planned) {
      if (!pl.entries) continue;
      const detail::ModelEntry& e = *pl.entry;
      std::vector<at::Tensor> tensors(names.size());
      for (size_t j = 0; j < names.size(); ++j) {
        const StateDictValue* v = pl.entries->find(names[j]);
        if (!v) continue;
        at::Tensor local;
        if (!e.fsdp_param) {
          local = v->tensor().detach().clone();
        } else {
          const ProcessGroup& group = group_of(e);
          local = v->is_sharded() ? detail::local_rows_from(v->sharded_tensor(), *e.fsdp_param, group)
                                  : detail::rows_of_full(*e.fsdp_param, v->tensor(), group.rank(), group.size());
          local = local.contiguous().clone();
        }
        tensors[j] = local.to(e.tensor.options().requires_grad(false));
      }
      const StateDictValue* step = pl.entries->find("step");
      const int64_t s = step ? step->tensor().reshape({}).item<int64_t>() : 0;
      states.emplace_back(pl.state_key, make_state(kind, tensors, s));
    }
  }

  // Write: options, then the whole state.
  for (size_t g = 0; g < new_options.size(); ++g) optim.param_groups()[g].set_options(std::move(new_options[g]));
  for (const auto& pl : planned) optim.state().erase(pl.state_key);
  for (auto& [key, st] : states) optim.state()[key] = std::move(st);
}

void init_optimizer_state(torch::optim::Optimizer& optim) {
  const Kind kind = kind_of(optim);
  at::NoGradGuard no_grad;
  for (auto& group : optim.param_groups()) {
    const auto& o = group.options();
    for (const auto& p : group.params()) {
      const auto key = compat::optimizer_state_key(p);
      if (optim.state().count(key)) continue;
      auto zeros = [&] { return at::zeros_like(p.detach(), at::MemoryFormat::Preserve); };
      std::vector<at::Tensor> t(tensor_entry_names(kind).size());
      switch (kind) {
        case Kind::kSGD:
          if (static_cast<const torch::optim::SGDOptions&>(o).momentum() == 0) continue;  // SGD keeps no state then
          t[0] = zeros();
          break;
        case Kind::kAdam:
        case Kind::kAdamW: {
          const bool amsgrad = kind == Kind::kAdam ? static_cast<const torch::optim::AdamOptions&>(o).amsgrad()
                                                   : static_cast<const torch::optim::AdamWOptions&>(o).amsgrad();
          t[0] = zeros();
          t[1] = zeros();
          if (amsgrad) t[2] = zeros();
          break;
        }
        case Kind::kAdagrad:
          t[0] = at::full_like(p.detach(), static_cast<const torch::optim::AdagradOptions&>(o).initial_accumulator_value());
          break;
        case Kind::kRMSprop: {
          const auto& r = static_cast<const torch::optim::RMSpropOptions&>(o);
          t[0] = zeros();
          if (r.momentum() > 0) t[1] = zeros();
          if (r.centered()) t[2] = zeros();
          break;
        }
      }
      optim.state()[key] = make_state(kind, t, 0);
    }
  }
}

StateDict flatten_optimizer_state(const OptimStateDict& osd) {
  StateDict flat;
  flat.type = osd.type;
  for (const auto& [key, entries] : osd.state)
    for (const auto& [name, value] : entries) flat.insert("state." + key + "." + name, value);
  return flat;
}

// ---- torch::save / torch::load --------------------------------------------------------------

void operator<<(torch::serialize::OutputArchive& archive, const OptimStateDict& sd) {
  c10::List<std::string> keys;
  int64_t i = 0;
  for (const auto& [key, entries] : sd.state) {
    keys.push_back(key);
    torch::serialize::OutputArchive sub(archive.compilation_unit());
    try {
      sub << entries;
    } catch (const Error& e) {
      throw Error("saving the optimizer state of '" + key + "': " + e.what());
    }
    archive.write("s" + std::to_string(i++), sub);
  }
  archive.write("fsdpp_optim_state_keys", c10::IValue(keys));
  archive.write("fsdpp_optim_param_groups", c10::IValue(static_cast<int64_t>(sd.param_groups.size())));
  for (size_t g = 0; g < sd.param_groups.size(); ++g) {
    const auto& group = sd.param_groups[g];
    torch::serialize::OutputArchive sub(archive.compilation_unit());
    c10::List<std::string> params;
    for (const auto& p : group.params) params.push_back(p);
    sub.write("params", c10::IValue(params));
    const std::string bytes = group.serialized_options();
    at::Tensor blob = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(blob.data_ptr(), bytes.data(), bytes.size());
    sub.write("options", blob);
    archive.write("g" + std::to_string(g), sub);
  }
}

void operator>>(torch::serialize::InputArchive& archive, OptimStateDict& sd) {
  c10::IValue keys, groups;
  if (!archive.try_read("fsdpp_optim_state_keys", keys) || !archive.try_read("fsdpp_optim_param_groups", groups))
    throw Error("loading an optimizer state dict with torch::load: not written from an fsdpp::OptimStateDict");
  OptimStateDict out;
  out.type = StateDictType::FULL_STATE_DICT;
  int64_t i = 0;
  for (const auto& k : keys.toListRef()) {
    torch::serialize::InputArchive sub;
    archive.read("s" + std::to_string(i++), sub);
    StateDict entries;
    sub >> entries;
    out.state.emplace(k.toStringRef(), std::move(entries));
  }
  for (int64_t g = 0; g < groups.toInt(); ++g) {
    torch::serialize::InputArchive sub;
    archive.read("g" + std::to_string(g), sub);
    OptimStateDict::ParamGroup group;
    c10::IValue params;
    sub.read("params", params);
    for (const auto& p : params.toListRef()) group.params.push_back(p.toStringRef());
    at::Tensor blob;
    sub.read("options", blob);
    blob = blob.contiguous();
    group.options_bytes.assign(static_cast<const char*>(blob.data_ptr()), static_cast<size_t>(blob.numel()));
    out.param_groups.push_back(std::move(group));
  }
  sd = std::move(out);
}

}  // namespace fsdpp
