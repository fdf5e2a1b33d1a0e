#pragma once
// Optimizer state dicts of FSDP models keyed by parameter names (PyTorch's
// torch.distributed.checkpoint.state_dict get_optimizer_state_dict / set_optimizer_state_dict).
//
//   auto osd = fsdpp::get_optimizer_state_dict(*model, opt, fsdpp::StateDictOptions().full_state_dict(true));
//   osd.state.at("0.weight").at("exp_avg").tensor();   // the whole exp_avg of parameter 0.weight
//   torch::save(osd, "optim.pt");                       // FULL dicts only
//   ... at another world size:
//   torch::load(osd, "optim.pt");
//   fsdpp::set_optimizer_state_dict(*model2, opt2, osd);
//
// Per parameter the entries are libtorch's state under PyTorch's names: "step" (a 0-dim int64
// tensor), "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (Adam, AdamW), "momentum_buffer" (SGD),
// "sum" (Adagrad), "square_avg", "momentum_buffer", "grad_avg" (RMSprop). FULL: whole tensors;
// SHARDED: a ShardedTensor for the state of a parameter FSDP shards (its rows, like the
// parameter), whole tensors otherwise. Supported optimizers: SGD, Adam, AdamW, Adagrad, RMSprop.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <fsdpp/state_dict.h>

namespace fsdpp {

// Parameters are named by their plain model keys, so a dict loads into any sharding of the same
// model. Its sibling IndexedOptimizerStateDict (<fsdpp/indexed_optimizer_state_dict.h>) is the
// positional libtorch-archive layout ZeroRedundancyOptimizer uses; an index says nothing about
// which parameter it is without the optimizer that wrote it, so the two layouts stay apart.
struct NamedOptimizerStateDict {
  struct ParamGroup {
    // The group's parameters by their plain model keys (a tied parameter by its first key).
    std::vector<std::string> params;
    // The group's hyperparameters: typed when taken from an optimizer, and as libtorch's
    // serialized bytes when read from a file (set_optimizer_state_dict parses them into the
    // target optimizer's options type).
    std::shared_ptr<torch::optim::OptimizerOptions> options;
    std::string options_bytes;
    // The hyperparameters as libtorch's serialized bytes, from whichever of the two is set.
    std::string serialized_options() const;
  };
  // Parameter key -> its state entries. Parameters without state (not stepped yet) are absent.
  std::map<std::string, StateDict> state;
  std::vector<ParamGroup> param_groups;
  std::optional<StateDictType> type;  // FULL_STATE_DICT or SHARDED_STATE_DICT
  // Set on the empty dict ranks other than 0 get with full_state_dict + cpu_offload.
  bool rank0_only_placeholder = false;
};

// The name before the positional / named distinction was spelled out.
using OptimStateDict [[deprecated("renamed fsdpp::NamedOptimizerStateDict")]] = NamedOptimizerStateDict;

// Collective over each FSDP unit's group (every rank takes part, also with rank0_only).
NamedOptimizerStateDict get_optimizer_state_dict(torch::nn::Module& model, const torch::optim::Optimizer& optim,
                                        const StateDictOptions& options = {});
// Loads FULL or SHARDED state into `optim` (built over `model`'s parameters, at any world size):
// the param groups must list the same parameter keys; every shape is checked before anything
// changes; the optimizer's state and group options are then replaced. A ShardedTensor sharded
// differently from the model is redistributed (collective over its group).
void set_optimizer_state_dict(torch::nn::Module& model, torch::optim::Optimizer& optim, const NamedOptimizerStateDict& sd,
                              const StateDictOptions& options = {});

template <typename M>
NamedOptimizerStateDict get_optimizer_state_dict(const torch::nn::ModuleHolder<M>& model, const torch::optim::Optimizer& optim,
                                        const StateDictOptions& options = {}) {
  return get_optimizer_state_dict(*model.ptr(), optim, options);
}
template <typename M>
void set_optimizer_state_dict(const torch::nn::ModuleHolder<M>& model, torch::optim::Optimizer& optim,
                              const NamedOptimizerStateDict& sd, const StateDictOptions& options = {}) {
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
StateDict flatten_optimizer_state(const NamedOptimizerStateDict& osd);

// torch::save / torch::load of a FULL optimizer state dict (whole tensors only).
void operator<<(torch::serialize::OutputArchive& archive, const NamedOptimizerStateDict& sd);
void operator>>(torch::serialize::InputArchive& archive, NamedOptimizerStateDict& sd);

}  // namespace fsdpp
