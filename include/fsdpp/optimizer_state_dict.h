#pragma once
// OptimizerStateDict: an optimizer's whole state (PyTorch's optimizer.state_dict()), the one
// type that ZeroRedundancyOptimizer consolidates and loads and that get_optimizer_state_dict /
// set_optimizer_state_dict (<fsdpp/state_dict.h>) give and take.
//
// Parameters are named by a key: PyTorch's positional ids "0", "1", ... running through
// param_groups in order (ZeroRedundancyOptimizer, from_optimizer, libtorch archives), or the
// plain model keys (get_optimizer_state_dict), which load into any sharding of the same model.
// The two kinds of key do not convert into each other without the model, so a dict loads where
// its keys mean something: positional ones into ZeroRedundancyOptimizer (or a plain optimizer
// through its archive), named ones through set_optimizer_state_dict.
//
// Per parameter the entries are libtorch's state under PyTorch's names: "step" (a 0-dim int64
// tensor), "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (Adam, AdamW), "momentum_buffer" (SGD),
// "sum" (Adagrad), "square_avg", "momentum_buffer", "grad_avg" (RMSprop); an optimizer with only
// fsdpp::OptimizerTraits gets its state's own serialized names. A sharded dict holds a
// ShardedTensor where FSDP shards the parameter.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <fsdpp/optimizer_traits.h>
#include <fsdpp/state_dict_container.h>

namespace fsdpp {

// Copies share tensors and typed options (like StateDict).
//
// save() / to_bytes() write libtorch's optimizer archive layout ("pytorch_version", "state",
// "param_groups" with "params/i" keys and "options"), so `torch::load(plain_optimizer, stream)`
// reads a positional dict; from_bytes() reads archives written by libtorch
// (`torch::save(plain_optimizer, ...)`) as well. In that layout a 0-dim int64, double or bool
// entry is written as a plain number (libtorch keeps "step" as an int64_t). Note that libtorch's
// own Optimizer::load restores the state but not the options; ZeroRedundancyOptimizer::
// load_state_dict restores both. torch::save / torch::load of the dict itself (the operators
// below) keep every key and are the way to store a named FULL dict.
struct OptimizerStateDict {
  struct ParamGroup {
    // The group's parameters by key (a tied parameter by its first model key).
    std::vector<std::string> params;
    // The group's hyperparameters: typed when taken from an optimizer or a libtorch archive, and
    // as libtorch's serialized bytes when read with torch::load (loads parse them into the
    // target optimizer's options type).
    std::shared_ptr<torch::optim::OptimizerOptions> options;
    std::string options_bytes;
    // The hyperparameters as libtorch's serialized bytes, from whichever of the two is set.
    std::string serialized_options() const;
  };
  // Parameter key -> its state entries. Parameters without state (not stepped yet) are absent.
  std::map<std::string, StateDict> state;
  std::vector<ParamGroup> param_groups;
  std::optional<StateDictType> type;  // FULL_STATE_DICT or SHARDED_STATE_DICT from get_optimizer_state_dict
  // Set on the empty dict ranks other than 0 get with full_state_dict + cpu_offload.
  bool rank0_only_placeholder = false;

  // Number of parameters over all groups.
  int64_t num_params() const;

  // The state of a plain (non-sharded) libtorch optimizer, with positional keys.
  static OptimizerStateDict from_optimizer(const torch::optim::Optimizer& optimizer);

  // libtorch's optimizer archive (whole tensors and typed options only).
  void save(torch::serialize::OutputArchive& archive) const;
  std::string to_bytes() const;

  // Reading needs the concrete types: `options_prototype` is cloned and deserialized for each
  // group; `make_state` makes an empty per-parameter state to deserialize into. Keys become
  // positional.
  using StateFactory = std::function<std::unique_ptr<torch::optim::OptimizerParamState>()>;
  static OptimizerStateDict load(torch::serialize::InputArchive& archive,
                                 const torch::optim::OptimizerOptions& options_prototype,
                                 const StateFactory& make_state);
  static OptimizerStateDict from_bytes(const std::string& bytes, const torch::optim::OptimizerOptions& options_prototype,
                                       const StateFactory& make_state);
  // For a libtorch optimizer type (or one with OptimizerTraits).
  template <typename O>
  static OptimizerStateDict from_bytes(const std::string& bytes) {
    using Traits = OptimizerTraits<O>;
    typename Traits::Options prototype(0.0);
    return from_bytes(bytes, prototype, [] { return std::make_unique<typename Traits::ParamState>(); });
  }
};

// torch::save / torch::load of a dict of whole tensors (FULL or positional), every key kept.
void operator<<(torch::serialize::OutputArchive& archive, const OptimizerStateDict& sd);
void operator>>(torch::serialize::InputArchive& archive, OptimizerStateDict& sd);

}  // namespace fsdpp
