// Optimizer state dicts (<fsdpp/optimizer_state_dict.h>) as checkpoint state, and the destinations
// a fresh optimizer loads them into.
#include <sstream>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>
#include <fsdpp/state_dict.h>

#include "checkpoint/format.h"

namespace fsdpp::checkpoint {

namespace {

std::string group_key(const std::string& prefix, size_t g, const char* what) {
  return prefix + "param_groups." + std::to_string(g) + "." + what;
}

}  // namespace

State to_state(const OptimizerStateDict& osd, const std::string& prefix) {
  if (osd.rank0_only_placeholder)
    throw Error("checkpoint: the optimizer state dict is the empty placeholder of a rank0_only FULL dict; "
                "save a SHARDED one (every rank) instead");
  State state;
  for (const auto& [param, entries] : osd.state) state.merge(to_state(entries, prefix + "state." + param + "."));
  for (size_t g = 0; g < osd.param_groups.size(); ++g) {
    const auto& group = osd.param_groups[g];
    std::string params;
    for (size_t i = 0; i < group.params.size(); ++i) params += (i ? "\n" : "") + group.params[i];
    state.emplace(group_key(prefix, g, "params"), Entry(params));
    state.emplace(group_key(prefix, g, "options"),
                  Entry::bytes(group.serialized_options()));
  }
  return state;
}

OptimizerStateDict optim_state_dict_to_load(const Metadata& m, const StateDict& model_sd, const std::string& prefix) {
  OptimizerStateDict osd;
  bool sharded = false;
  for (const auto& [param, value] : model_sd) {
    const std::string start = prefix + "state." + param + ".";
    for (auto it = m.entries.lower_bound(start); it != m.entries.end() && it->first.rfind(start, 0) == 0; ++it) {
      const std::string name = it->first.substr(start.size());
      if (name.find('.') != std::string::npos) continue;  // another parameter's, e.g. "<param>.x.<name>"
      const EntryInfo& e = it->second;
      if (e.kind != Entry::Kind::kTensor)
        throw Error("checkpoint: optimizer state '" + it->first + "' is a " + to_string(e.kind) + ", not a tensor");
      const auto options = at::TensorOptions().dtype(detail::dtype_from_name(e.dtype, it->first));
      StateDict& entries = osd.state[param];
      if (value.is_sharded() && e.shape == value.sizes()) {
        // Sharded like the parameter.
        const ShardedTensor& like = value.sharded_tensor();
        std::vector<Shard> shards;
        for (const auto& s : like.local_shards())
          shards.push_back(Shard{at::empty(s.metadata.shard_sizes, options), s.metadata});
        entries.insert(name, ShardedTensor::from_local_shards_and_global_metadata(
                                 std::move(shards), like.size(), options.dtype().toScalarType(),
                                 like.shards_metadata(), like.process_group()));
        sharded = true;
      } else {
        entries.insert(name, at::empty(e.shape, options));
      }
    }
  }
  for (size_t g = 0;; ++g) {
    auto params = m.entries.find(group_key(prefix, g, "params"));
    auto options = m.entries.find(group_key(prefix, g, "options"));
    if (params == m.entries.end() || options == m.entries.end()) break;
    OptimizerStateDict::ParamGroup group;
    std::istringstream in(params->second.value.to_string());
    for (std::string key; std::getline(in, key);) group.params.push_back(key);
    group.options_bytes = options->second.value.to_string();
    osd.param_groups.push_back(std::move(group));
  }
  if (osd.param_groups.empty())
    throw Error("checkpoint: no optimizer state dict saved under '" + prefix + "' (no " +
                group_key(prefix, 0, "params") + ")");
  osd.type = sharded ? StateDictType::SHARDED_STATE_DICT : StateDictType::FULL_STATE_DICT;
  return osd;
}

}  // namespace fsdpp::checkpoint
