// Model state dicts: FULL / SHARDED / LOCAL, the per-model state-dict type, and the
// functional get_model_state_dict / set_model_state_dict.
#include <fsdpp/state_dict.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>
#include <fsdpp/model_layout.h>

#include "common/shape_string.h"

namespace fsdpp {

using ModelEntry = ModelLayout::Entry;
using detail::shape_string;

// ---- the per-model state-dict type ---------------------------------------------------------

const char* config_type_name(const StateDictConfig& config) {
  switch (config.index()) {
    case 0: return "FullStateDictConfig";
    case 1: return "ShardedStateDictConfig";
    default: return "LocalStateDictConfig";
  }
}

namespace {

struct Registered {
  std::weak_ptr<torch::nn::Module> owner;  // empty for a module not owned by a shared_ptr
  bool owned = false;
  StateDictSettings settings;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<const torch::nn::Module*, Registered>& registry() {
  static std::unordered_map<const torch::nn::Module*, Registered> r;
  return r;
}

std::optional<StateDictSettings> lookup(const torch::nn::Module& m) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(&m);
  if (it == registry().end()) return std::nullopt;
  // A module that died and whose address was reused must not inherit the settings.
  if (it->second.owned && it->second.owner.expired()) {
    registry().erase(it);
    return std::nullopt;
  }
  return it->second.settings;
}

void store(torch::nn::Module& m, const std::optional<StateDictSettings>& settings) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (!settings) {
    registry().erase(&m);
    return;
  }
  auto weak = m.weak_from_this();
  registry()[&m] = Registered{weak, !weak.expired(), *settings};
}

std::vector<std::shared_ptr<torch::nn::Module>> units_of(torch::nn::Module& model) {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const auto& m : model.modules(/*include_self=*/false))
    if (dynamic_cast<FSDPModule*>(m.get())) out.push_back(m);
  return out;
}

StateDictSettings checked_settings(StateDictType type, std::optional<StateDictConfig> config) {
  const size_t expected = type == StateDictType::FULL_STATE_DICT      ? 0
                          : type == StateDictType::SHARDED_STATE_DICT ? 1
                                                                       : 2;
  StateDictSettings s;
  s.state_dict_type = type;
  if (!config) {
    s.state_dict_config = expected == 0   ? StateDictConfig(FullStateDictConfig())
                          : expected == 1 ? StateDictConfig(ShardedStateDictConfig())
                                          : StateDictConfig(LocalStateDictConfig());
    return s;
  }
  if (config->index() != expected) {
    const char* want = expected == 0 ? "FullStateDictConfig" : expected == 1 ? "ShardedStateDictConfig" : "LocalStateDictConfig";
    throw Error(std::string("state_dict_type(") + to_string(type) + "): expected state_dict_config of type " + want +
                " but got " + config_type_name(*config));
  }
  s.state_dict_config = *config;
  return s;
}

}  // namespace

StateDictSettings get_state_dict_type(const torch::nn::Module& model) {
  if (auto s = lookup(model)) return *s;
  for (const auto& m : model.modules(/*include_self=*/false))
    if (dynamic_cast<FSDPModule*>(m.get()))
      if (auto s = lookup(*m)) return *s;
  return {};
}

StateDictSettings set_state_dict_type(torch::nn::Module& model, StateDictType type,
                                      std::optional<StateDictConfig> config) {
  StateDictSettings settings = checked_settings(type, std::move(config));
  StateDictSettings previous = get_state_dict_type(model);
  store(model, settings);
  for (const auto& u : units_of(model)) store(*u, settings);
  return previous;
}

StateDictTypeScope::StateDictTypeScope(torch::nn::Module& model, StateDictType type,
                                       std::optional<StateDictConfig> config) {
  StateDictSettings settings = checked_settings(type, std::move(config));  // throws before changing anything
  std::vector<torch::nn::Module*> targets{&model};
  for (const auto& u : units_of(model)) targets.push_back(u.get());
  for (auto* m : targets) {
    previous_.emplace_back(m->weak_from_this(), lookup(*m));
    store(*m, settings);
  }
}

StateDictTypeScope::~StateDictTypeScope() {
  for (auto& [weak, settings] : previous_)
    if (auto m = weak.lock()) store(*m, settings);
}

StateDictTypeScope state_dict_type(torch::nn::Module& model, StateDictType type, std::optional<StateDictConfig> config) {
  return StateDictTypeScope(model, type, std::move(config));
}

// ---- producing state dicts ------------------------------------------------------------------

namespace {

int global_rank() {
  try {
    return default_group().rank();
  } catch (const Error&) {
    return 0;  // no process group: a single process
  }
}

at::Tensor offloaded(const at::Tensor& t, bool offload) {
  return offload ? t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/false) : t;
}
ShardedTensor offload_sharded(const ShardedTensor& st, bool offload) { return offload ? st.cpu() : st; }

// Each FSDP parameter's full value by its TensorImpl (collective over each unit's group).
std::unordered_map<const c10::TensorImpl*, at::Tensor> gather_full_params(const ModelLayout& layout) {
  std::unordered_map<const c10::TensorImpl*, at::Tensor> out;
  for (const auto& u : layout.units) {
    auto params = u.unit->sharded_parameters();
    auto full = u.unit->full_parameters();
    for (size_t i = 0; i < params.size(); ++i) out[params[i].param.unsafeGetTensorImpl()] = std::move(full[i]);
  }
  return out;
}

StateDict produce(torch::nn::Module& model, StateDictType type, bool offload, bool rank0_only) {
  at::NoGradGuard no_grad;
  const ModelLayout layout(model);
  StateDict sd;
  // Without FSDP units or TP shards every entry is whole: the dict is a FULL one whatever was asked.
  const bool sharded_entries = std::any_of(layout.entries.begin(), layout.entries.end(),
                                           [](const ModelEntry& e) { return e.layout.has_value(); });
  sd.type = sharded_entries ? type : StateDictType::FULL_STATE_DICT;
  if (type == StateDictType::FULL_STATE_DICT) {
    // Every rank takes part in the gathers, rank0_only or not: FSDP's over each unit's group,
    // then a tensor-parallel entry's over its TP group (in module order, the same on every rank).
    auto full = gather_full_params(layout);
    std::vector<at::Tensor> values;
    for (const auto& e : layout.entries) {
      at::Tensor v = e.sharded ? full.at(e.tensor.unsafeGetTensorImpl()) : e.tensor.detach().clone();
      if (e.tp_layout && e.tp_layout->placements().front().is_shard())  // a Replicate one is whole already
        v = e.tp_layout->to_sharded_tensor(v.contiguous(), /*copy=*/false).full_tensor();
      values.push_back(std::move(v));
    }
    if (rank0_only && global_rank() != 0) {
      StateDict empty;
      empty.type = type;
      empty.rank0_only_placeholder = true;
      return empty;
    }
    for (size_t i = 0; i < layout.entries.size(); ++i) sd.insert(layout.entries[i].key, offloaded(values[i], offload));
    return sd;
  }
  // LOCAL: this rank's own tensors. An FSDP unit's flat parameter (over its group; for a 2-D
  // model, of this tp rank's TP-local parts), and every other tensor as the module holds it (a
  // tensor-parallel one: its TP-local part).
  size_t next_unit = 0;
  for (size_t i = 0; i <= layout.entries.size(); ++i) {
    if (type == StateDictType::LOCAL_STATE_DICT)
      for (; next_unit < layout.units.size() && layout.units[next_unit].first_entry == i; ++next_unit)
        sd.insert(layout.units[next_unit].flat_key, offload_sharded(layout.units[next_unit].unit->flat_parameter(), offload));
    if (i == layout.entries.size()) break;
    const ModelEntry& e = layout.entries[i];
    if (type == StateDictType::SHARDED_STATE_DICT && e.layout) {
      const at::Tensor& local = e.sharded ? e.sharded->local_shard : e.tensor;
      sd.insert(e.key, offload_sharded(e.layout->to_sharded_tensor(local, /*copy=*/true), offload));
    } else if (!(type == StateDictType::LOCAL_STATE_DICT && e.sharded)) {  // LOCAL: in its unit's flat parameter
      sd.insert(e.key, offloaded(e.tensor.detach().clone(), offload));
    }
  }
  return sd;
}

}  // namespace

StateDict state_dict(torch::nn::Module& model) {
  const StateDictSettings s = get_state_dict_type(model);
  return std::visit(
      [&](const auto& config) {
        using C = std::decay_t<decltype(config)>;
        bool rank0_only = false;
        if constexpr (std::is_same_v<C, FullStateDictConfig>) rank0_only = config.rank0_only();
        return produce(model, s.state_dict_type, config.offload_to_cpu(), rank0_only);
      },
      s.state_dict_config);
}

StateDict get_model_state_dict(torch::nn::Module& model, const StateDictOptions& options) {
  if (options.full_state_dict())
    return produce(model, StateDictType::FULL_STATE_DICT, options.cpu_offload(), /*rank0_only=*/options.cpu_offload());
  return produce(model, StateDictType::SHARDED_STATE_DICT, options.cpu_offload(), false);
}

// ---- loading --------------------------------------------------------------------------------

namespace {

std::string join(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

void check_shape(const std::string& api, const std::string& key, const std::vector<int64_t>& given,
                 const std::vector<int64_t>& expected) {
  if (given != expected)
    throw Error(api + ": size mismatch for '" + key + "': copying a param with shape " + shape_string(given) +
                " from the state dict, the shape in the current model is " + shape_string(expected));
}

// ---- load: check, plan, resolve, commit (the shape of checkpoint::load): nothing is written
// until every entry has been checked and every source resolved.

// What a load asks of this model: its layout, the kind it expects, the name for errors.
struct LoadRequest {
  const StateDict& sd;
  ModelLayout layout;
  std::optional<StateDictType> expected;
  std::string api;
  bool local() const { return expected == StateDictType::LOCAL_STATE_DICT; }
};

// Check: the dict's kind and keys against the model's (strict: no missing or unexpected key).
IncompatibleKeys check_keys(const LoadRequest& req, bool strict) {
  const std::string& api = req.api;
  if (req.sd.rank0_only_placeholder)
    throw Error(api + ": rank " + std::to_string(global_rank()) +
                " was given the empty state dict that a FULL state dict with rank0_only gives ranks other than 0; "
                "load rank 0's dict on every rank, or use set_model_state_dict with broadcast_from_rank0");
  if (req.expected && req.sd.type && *req.sd.type != *req.expected)
    throw Error(api + ": the state dict is a " + to_string(*req.sd.type) + " but the model's state_dict_type is " +
                to_string(*req.expected));
  // Expected keys, in module order.
  std::vector<std::string> model_keys;
  std::unordered_set<std::string> model_key_set, fsdp_param_keys;
  for (const auto& u : req.layout.units)
    if (req.local()) model_keys.push_back(u.flat_key);
  for (const auto& e : req.layout.entries) {
    if (e.sharded) fsdp_param_keys.insert(e.key);
    if (!(req.local() && e.sharded)) model_keys.push_back(e.key);
  }
  model_key_set.insert(model_keys.begin(), model_keys.end());
  IncompatibleKeys result;
  for (const auto& k : model_keys)
    if (!req.sd.contains(k)) result.missing_keys.push_back(k);
  for (const auto& [k, v] : req.sd)
    if (!model_key_set.count(k)) result.unexpected_keys.push_back(k);
  if (req.local()) {
    for (const auto& k : result.unexpected_keys)
      if (fsdp_param_keys.count(k))
        throw Error(api + ": the model's state_dict_type is LOCAL_STATE_DICT, which holds one '<unit>._flat_param' per "
                    "FSDP unit, but the state dict holds the parameter '" + k + "' (a FULL or SHARDED state dict?)");
  } else {
    for (const auto& k : result.unexpected_keys)
      if (k.size() >= 11 && k.compare(k.size() - 11, 11, "_flat_param") == 0)
        throw Error(api + ": the state dict holds '" + k + "', a LOCAL_STATE_DICT flat parameter, but the model's "
                    "state_dict_type is " + (req.expected ? to_string(*req.expected) : std::string("FULL or SHARDED")));
  }
  if (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty())) {
    std::string msg = api + ": error(s) in loading the state dict:";
    if (!result.unexpected_keys.empty()) msg += " unexpected key(s) in state_dict: " + join(result.unexpected_keys) + ".";
    if (!result.missing_keys.empty()) msg += " missing key(s) in state_dict: " + join(result.missing_keys) + ".";
    throw Error(msg);
  }
  return result;
}

// One write of the load, prepared before anything is written.
struct Write {
  at::Tensor dst;
  std::function<at::Tensor()> src;  // may communicate (redistribution); called in module order
};

// Plan: checks every present entry (shape, whole or sharded as the kind says) and says where
// its value goes and how this rank's part of it is found.
std::vector<Write> plan_writes(const LoadRequest& req) {
  const std::string& api = req.api;
  std::vector<Write> writes;
  for (const auto& e : req.layout.entries) {
    if (req.local() && e.sharded) continue;
    const StateDictValue* v = req.sd.find(e.key);
    if (!v) continue;
    // LOCAL: a tensor-parallel entry outside FSDP units is this rank's TP part, whole.
    const bool tp_local = req.local() && e.tp_layout && e.tp_layout->placements().front().is_shard();
    if (tp_local) {
      const TensorLayout& tp = *e.tp_layout;
      const std::string part = "this rank's tensor-parallel part of '" + e.key + "' (global shape " +
                               shape_string(tp.global_shape()) + ", " + tp.placements().front().to_string() +
                               " over the TP group of " + std::to_string(tp.process_group().size()) +
                               " ranks), shape " + shape_string(e.tensor.sizes());
      if (!v->is_tensor())
        throw Error(api + ": '" + e.key + "' is a ShardedTensor of global shape " + shape_string(v->sizes()) +
                    ", but a LOCAL_STATE_DICT holds " + part + ", as a whole tensor");
      if (v->tensor().sizes() != e.tensor.sizes())
        throw Error(api + ": size mismatch for '" + e.key + "': the LOCAL_STATE_DICT holds shape " +
                    shape_string(v->tensor().sizes()) + ", but the model's LOCAL layout is " + part +
                    " (a dict of a different tensor-parallel layout or rank?)");
    }
    if (!e.layout || tp_local) {
      if (!v->is_tensor())
        throw Error(api + ": '" + e.key + "' is a ShardedTensor but the model holds it whole (sharded neither by FSDP "
                    "nor by tensor parallelism)");
      check_shape(api, e.key, v->tensor().sizes().vec(), e.tensor.sizes().vec());
      at::Tensor src = v->tensor();
      writes.push_back({e.tensor, [src] { return src; }});
      continue;
    }
    const TensorLayout& layout = *e.layout;
    check_shape(api, e.key, v->sizes(), layout.global_shape());
    if (v->is_tensor()) {
      if (req.expected == StateDictType::SHARDED_STATE_DICT)
        throw Error(api + ": '" + e.key + "' is a whole tensor but the model's state_dict_type is SHARDED_STATE_DICT, "
                    "which loads a ShardedTensor per parameter (a FULL state dict? load it under FULL_STATE_DICT)");
      at::Tensor src = v->tensor();
      writes.push_back({e.tensor, [&layout, src] { return layout.local_of_full(src); }});
    } else {
      if (req.expected == StateDictType::FULL_STATE_DICT)
        throw Error(api + ": '" + e.key + "' is a ShardedTensor but the model's state_dict_type is FULL_STATE_DICT, "
                    "which loads whole tensors (a SHARDED state dict? load it under SHARDED_STATE_DICT)");
      ShardedTensor st = v->sharded_tensor();
      writes.push_back({e.tensor, [&layout, st] { return layout.local_from(st); }});
    }
  }
  if (!req.local()) return writes;
  for (const auto& u : req.layout.units) {
    const StateDictValue* v = req.sd.find(u.flat_key);
    if (!v) continue;
    const auto params = u.unit->sharded_parameters();
    int64_t total = 0;
    for (const auto& p : params) total += p.layout.numel();
    if (!v->is_sharded())
      throw Error(api + ": '" + u.flat_key + "' is a whole tensor; LOCAL_STATE_DICT loads a ShardedTensor per unit");
    check_shape(api, u.flat_key, v->sizes(), {total});
    // One source resolves the unit (redistributing at most once); the others read its result.
    auto rows = std::make_shared<std::vector<at::Tensor>>();
    const ShardedTensor st = v->sharded_tensor();
    FSDPModule* unit = u.unit;
    for (size_t i = 0; i < params.size(); ++i)
      writes.push_back({params[i].param, [unit, st, rows, i] {
                          if (rows->empty()) *rows = unit->local_rows_from_flat_parameter(st);
                          return (*rows)[i];
                        }});
  }
  return writes;
}

// Resolve: every source, in module order on every rank (redistributions are collectives).
std::vector<at::Tensor> resolve(const std::vector<Write>& writes) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> sources;
  sources.reserve(writes.size());
  for (const auto& w : writes) sources.push_back(w.src());
  return sources;
}

// Commit: units gathered (the root after forward) go back to shards, which are what is written.
void commit(const LoadRequest& req, const std::vector<Write>& writes, const std::vector<at::Tensor>& sources) {
  for (const auto& u : req.layout.units) u.unit->reshard();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < writes.size(); ++i) {
    at::Tensor dst = writes[i].dst.detach();
    if (dst.sizes() != sources[i].sizes())
      throw Error(req.api + ": internal: shard of shape " + shape_string(sources[i].sizes()) + " for a tensor of shape " +
                  shape_string(dst.sizes()));
    dst.copy_(sources[i]);
  }
}

IncompatibleKeys load(torch::nn::Module& model, const StateDict& sd, std::optional<StateDictType> expected, bool strict,
                      const std::string& api) {
  const LoadRequest req{sd, ModelLayout(model), expected, api};
  IncompatibleKeys result = check_keys(req, strict);
  const std::vector<Write> writes = plan_writes(req);
  commit(req, writes, resolve(writes));
  return result;
}

// Rank 0's FULL dict on every rank of the default group: keys, dtypes and shapes first, then
// one broadcast per tensor.
StateDict broadcast_full_from_rank0(const StateDict& sd, const std::string& api) {
  ProcessGroup world = default_group();
  const int rank = world.rank();
  std::string meta;
  if (rank == 0) {
    std::ostringstream out;
    for (const auto& [key, value] : sd) {
      if (!value.is_tensor())
        throw Error(api + ": broadcast_from_rank0 needs whole tensors; '" + key + "' is a ShardedTensor");
      out << key << '\t' << static_cast<int>(value.dtype());
      for (int64_t s : value.tensor().sizes()) out << '\t' << s;
      out << '\n';
    }
    meta = out.str();
  }
  broadcast_bytes(meta, world.global_rank(0), world);
  StateDict out;
  out.type = StateDictType::FULL_STATE_DICT;
  std::istringstream in(meta);
  std::string line;
  at::NoGradGuard no_grad;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key, field;
    std::getline(fields, key, '\t');
    std::getline(fields, field, '\t');
    const auto dtype = static_cast<at::ScalarType>(std::stoi(field));
    std::vector<int64_t> shape;
    while (std::getline(fields, field, '\t')) shape.push_back(std::stoll(field));
    // Through host memory: every rank's tensor on one device, whatever rank 0's state dict is on
    // (a GPU tensor against the others' CPU ones would take two backends); the load copies it to
    // the parameters' device.
    at::Tensor t = rank == 0 ? sd.at(key).tensor().detach().to(at::kCPU).contiguous()
                             : at::empty(shape, at::TensorOptions().dtype(dtype));
    broadcast(t, world.global_rank(0), world);
    out.insert(key, t);
  }
  return out;
}

}  // namespace

IncompatibleKeys load_state_dict(torch::nn::Module& model, const StateDict& sd, bool strict) {
  return load(model, sd, get_state_dict_type(model).state_dict_type, strict, "load_state_dict");
}

IncompatibleKeys set_model_state_dict(torch::nn::Module& model, const StateDict& sd, const StateDictOptions& options) {
  if (options.broadcast_from_rank0()) {
    StateDict full = broadcast_full_from_rank0(sd, "set_model_state_dict");
    return load(model, full, std::nullopt, options.strict(), "set_model_state_dict");
  }
  return load(model, sd, std::nullopt, options.strict(), "set_model_state_dict");
}

}  // namespace fsdpp
