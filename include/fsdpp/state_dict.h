#pragma once
// State dicts of FSDP and tensor-parallel models: the model's (PyTorch's FSDP.state_dict_type /
// model.state_dict() and torch.distributed.checkpoint.state_dict's get_model_state_dict /
// set_model_state_dict) and the optimizer's (the same module's get_optimizer_state_dict /
// set_optimizer_state_dict). The dicts are values of <fsdpp/state_dict_container.h> (StateDict)
// and <fsdpp/optimizer_state_dict.h> (OptimizerStateDict).
//
// Keys are always the plain model's keys (no `_fsdp_wrapped_module.` segment), in module
// order: each module's parameters, then its buffers, then its children's. Three kinds:
//   FULL_STATE_DICT     every entry a whole tensor (all-gathered); a plain model loads it.
//   SHARDED_STATE_DICT  each FSDP-sharded parameter a ShardedTensor (this rank's dim-0 rows
//                       with their offsets); other parameters and buffers whole tensors.
//   LOCAL_STATE_DICT    per FSDP unit one `<unit>._flat_param` ShardedTensor: the unit's
//                       parameters flattened and concatenated (FSDP1's flat parameter) of
//                       which this rank holds the rows it shards, without padding.
// See docs/api.md, "State dicts".
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <fsdpp/optimizer_state_dict.h>
#include <fsdpp/state_dict_container.h>

namespace fsdpp {

// ---- FSDP1 style: a state-dict type per model ----------------------------------------------

struct FullStateDictConfig {
  TORCH_ARG(bool, offload_to_cpu) = false;
  // Only rank 0 gets the entries; the others get an empty dict (rank0_only_placeholder).
  TORCH_ARG(bool, rank0_only) = false;
};
struct ShardedStateDictConfig {
  TORCH_ARG(bool, offload_to_cpu) = false;
};
struct LocalStateDictConfig {
  TORCH_ARG(bool, offload_to_cpu) = false;
};
using StateDictConfig = std::variant<FullStateDictConfig, ShardedStateDictConfig, LocalStateDictConfig>;
const char* config_type_name(const StateDictConfig& config);

struct StateDictSettings {
  StateDictType state_dict_type = StateDictType::FULL_STATE_DICT;
  StateDictConfig state_dict_config = FullStateDictConfig();
};

// Sets the type (and config; default: the type's default config) that state_dict(model) and
// load_state_dict(model, ...) use, on `model` and every FSDP unit inside it. A config of
// another type than `type` throws "expected state_dict_config of type ...". Returns the
// previous settings of `model`.
StateDictSettings set_state_dict_type(torch::nn::Module& model, StateDictType type,
                                      std::optional<StateDictConfig> config = std::nullopt);
// The model's settings: its own, else those of the first FSDP unit inside it, else FULL.
StateDictSettings get_state_dict_type(const torch::nn::Module& model);

// The scope form: sets the type now, restores the previous settings when it goes out of scope.
//   { auto scope = fsdpp::state_dict_type(*model, fsdpp::StateDictType::SHARDED_STATE_DICT);
//     auto sd = fsdpp::state_dict(*model); }
class [[nodiscard]] StateDictTypeScope {
 public:
  StateDictTypeScope(torch::nn::Module& model, StateDictType type, std::optional<StateDictConfig> config);
  ~StateDictTypeScope();
  StateDictTypeScope(const StateDictTypeScope&) = delete;
  StateDictTypeScope& operator=(const StateDictTypeScope&) = delete;

 private:
  std::weak_ptr<torch::nn::Module> model_;
  std::vector<std::pair<std::weak_ptr<torch::nn::Module>, std::optional<StateDictSettings>>> previous_;
};
StateDictTypeScope state_dict_type(torch::nn::Module& model, StateDictType type,
                                   std::optional<StateDictConfig> config = std::nullopt);

// PyTorch's _IncompatibleKeys: what a non-strict load skipped (plain keys).
struct IncompatibleKeys {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

// The model's state dict of its current state-dict type. Collective over each unit's group for
// FULL (an all-gather per unit); SHARDED and LOCAL communicate nothing. Entries are copies.
StateDict state_dict(torch::nn::Module& model);
// Loads a state dict of the model's current type. Everything is checked before anything is
// written (a failed load leaves the model unchanged): keys (strict: missing and unexpected ones
// are an error listing them; otherwise they are returned), shapes (always an error naming the
// key and both shapes), the kind of each entry. A ShardedTensor sharded differently from the
// model (another world size) is redistributed: collective over its process group.
IncompatibleKeys load_state_dict(torch::nn::Module& model, const StateDict& sd, bool strict = true);

// ---- Functional style (torch.distributed.checkpoint.state_dict) ---------------------------

struct StateDictOptions {
  // FULL instead of SHARDED.
  TORCH_ARG(bool, full_state_dict) = false;
  // Offload to CPU; with full_state_dict, only rank 0 gets the entries (others: empty dict).
  TORCH_ARG(bool, cpu_offload) = false;
  // Loading: missing or unexpected keys are an error.
  TORCH_ARG(bool, strict) = true;
  // Loading a FULL dict that only rank 0 holds: rank 0 broadcasts it over the default group
  // (every rank of it must call set_model_state_dict / set_optimizer_state_dict).
  TORCH_ARG(bool, broadcast_from_rank0) = false;
};

StateDict get_model_state_dict(torch::nn::Module& model, const StateDictOptions& options = {});
// Accepts a FULL or SHARDED dict (each entry by its kind).
IncompatibleKeys set_model_state_dict(torch::nn::Module& model, const StateDict& sd,
                                      const StateDictOptions& options = {});

// Overloads for module holders (fsdpp::FullyShardedDataParallel<...>, torch::nn::Sequential).
template <typename M>
StateDict state_dict(const torch::nn::ModuleHolder<M>& model) {
  return state_dict(*model.ptr());
}
template <typename M>
IncompatibleKeys load_state_dict(const torch::nn::ModuleHolder<M>& model, const StateDict& sd, bool strict = true) {
  return load_state_dict(*model.ptr(), sd, strict);
}
template <typename M>
StateDict get_model_state_dict(const torch::nn::ModuleHolder<M>& model, const StateDictOptions& options = {}) {
  return get_model_state_dict(*model.ptr(), options);
}
template <typename M>
IncompatibleKeys set_model_state_dict(const torch::nn::ModuleHolder<M>& model, const StateDict& sd,
                                      const StateDictOptions& options = {}) {
  return set_model_state_dict(*model.ptr(), sd, options);
}

// ---- Optimizer state dicts keyed by parameter names ----------------------------------------
//
//   auto osd = fsdpp::get_optimizer_state_dict(*model, opt, fsdpp::StateDictOptions().full_state_dict(true));
//   osd.state.at("0.weight").at("exp_avg").tensor();   // the whole exp_avg of parameter 0.weight
//   torch::save(osd, "optim.pt");                       // FULL dicts only
//   ... at another world size:
//   torch::load(osd, "optim.pt");
//   fsdpp::set_optimizer_state_dict(*model2, opt2, osd);
//
// The dict is an OptimizerStateDict (its entries listed in <fsdpp/optimizer_state_dict.h>) keyed
// by plain model keys. FULL: whole tensors; SHARDED: a ShardedTensor for the state of a
// parameter FSDP shards (its rows, like the parameter), whole tensors otherwise. Supported
// optimizers: SGD, Adam, AdamW, Adagrad, RMSprop.

// Collective over each FSDP unit's group (every rank takes part, also with rank0_only).
OptimizerStateDict get_optimizer_state_dict(torch::nn::Module& model, const torch::optim::Optimizer& optim,
                                           const StateDictOptions& options = {});
// Loads FULL or SHARDED state into `optim` (built over `model`'s parameters, at any world size):
// the param groups must list the same parameter keys; every shape is checked before anything
// changes; the optimizer's state and group options are then replaced. A ShardedTensor sharded
// differently from the model is redistributed (collective over its group).
void set_optimizer_state_dict(torch::nn::Module& model, torch::optim::Optimizer& optim, const OptimizerStateDict& sd,
                              const StateDictOptions& options = {});

template <typename M>
OptimizerStateDict get_optimizer_state_dict(const torch::nn::ModuleHolder<M>& model, const torch::optim::Optimizer& optim,
                                            const StateDictOptions& options = {}) {
  return get_optimizer_state_dict(*model.ptr(), optim, options);
}
template <typename M>
void set_optimizer_state_dict(const torch::nn::ModuleHolder<M>& model, torch::optim::Optimizer& optim,
                              const OptimizerStateDict& sd, const StateDictOptions& options = {}) {
  set_optimizer_state_dict(*model.ptr(), optim, sd, options);
}

// Gives every parameter of `optim` without state the state its first step would create (zeros,
// step 0; Adam/AdamW/RMSprop then step exactly as without it; SGD with dampening does not), so a
// fresh optimizer's get_optimizer_state_dict is a complete template to load into in place, e.g.
// with the distributed checkpoint:
//   fsdpp::init_optimizer_state(opt);
//   auto osd = fsdpp::get_optimizer_state_dict(*model, opt);       // SHARDED template
//   auto flat = fsdpp::flatten_optimizer_state(osd);               // shares osd's tensors
//   ... fill flat's tensors in place (checkpoint::load(flat, dir)) ...
//   fsdpp::set_optimizer_state_dict(*model, opt, osd);
void init_optimizer_state(torch::optim::Optimizer& optim);

// The state entries as one StateDict keyed "state.<parameter key>.<entry>" (PyTorch's flattened
// optimizer state dict keys), sharing osd's tensors and shards. Hyperparameters stay in
// osd.param_groups.
StateDict flatten_optimizer_state(const OptimizerStateDict& osd);

}  // namespace fsdpp
