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
// The dict is fsdpp::OptimizerStateDict (<fsdpp/optimizer_state_dict.h>, its entries listed there)
// keyed by plain model keys. FULL: whole tensors; SHARDED: a ShardedTensor for the state of a
// parameter FSDP shards (its rows, like the parameter), whole tensors otherwise. Supported
// optimizers: SGD, Adam, AdamW, Adagrad, RMSprop.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <fsdpp/optimizer_state_dict.h>
#include <fsdpp/state_dict.h>

namespace fsdpp {

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
