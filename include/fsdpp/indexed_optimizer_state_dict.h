#pragma once
// IndexedOptimizerStateDict: an optimizer's whole state (PyTorch's optimizer.state_dict()) with
// parameters named by their position, in libtorch's own optimizer archive layout. It is what
// ZeroRedundancyOptimizer consolidates and loads. Its sibling NamedOptimizerStateDict
// (<fsdpp/optim_state_dict.h>) names parameters by their model keys and may hold shards; the
// two stay apart because their keys cannot be converted without the model.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <fsdpp/optimizer_traits.h>

namespace fsdpp {

// Parameters are indices 0, 1, ... running through param_groups in order, as in PyTorch.
// Copies are deep (options and state are cloned).
//
// save() / to_bytes() write libtorch's optimizer archive layout ("pytorch_version", "state",
// "param_groups" with "params/i" keys and "options"), so `torch::load(plain_optimizer, stream)`
// reads it; from_bytes() reads archives written by libtorch (`torch::save(plain_optimizer, ...)`)
// as well. Note that libtorch's own Optimizer::load restores the state but not the options;
// ZeroRedundancyOptimizer::load_state_dict restores both.
struct IndexedOptimizerStateDict {
  struct ParamGroup {
    std::vector<int64_t> params;
    std::unique_ptr<torch::optim::OptimizerOptions> options;
  };
  std::vector<ParamGroup> param_groups;
  std::map<int64_t, std::unique_ptr<torch::optim::OptimizerParamState>> state;

  IndexedOptimizerStateDict() = default;
  IndexedOptimizerStateDict(const IndexedOptimizerStateDict& other);
  IndexedOptimizerStateDict& operator=(const IndexedOptimizerStateDict& other);
  IndexedOptimizerStateDict(IndexedOptimizerStateDict&&) = default;
  IndexedOptimizerStateDict& operator=(IndexedOptimizerStateDict&&) = default;

  // Number of parameters over all groups.
  int64_t num_params() const;

  // The state of a plain (non-sharded) libtorch optimizer.
  static IndexedOptimizerStateDict from_optimizer(const torch::optim::Optimizer& optimizer);

  void save(torch::serialize::OutputArchive& archive) const;
  std::string to_bytes() const;

  // Reading needs the concrete types: `options_prototype` is cloned and deserialized for each
  // group; `make_state` makes an empty per-parameter state to deserialize into.
  using StateFactory = std::function<std::unique_ptr<torch::optim::OptimizerParamState>()>;
  static IndexedOptimizerStateDict load(torch::serialize::InputArchive& archive,
                                        const torch::optim::OptimizerOptions& options_prototype,
                                        const StateFactory& make_state);
  static IndexedOptimizerStateDict from_bytes(const std::string& bytes,
                                              const torch::optim::OptimizerOptions& options_prototype,
                                              const StateFactory& make_state);
  // For a libtorch optimizer type (or one with OptimizerTraits).
  template <typename O>
  static IndexedOptimizerStateDict from_bytes(const std::string& bytes) {
    using Traits = OptimizerTraits<O>;
    typename Traits::Options prototype(0.0);
    return from_bytes(bytes, prototype, [] { return std::make_unique<typename Traits::ParamState>(); });
  }
};

// The name before the positional / named distinction was spelled out.
using OptimizerStateDict [[deprecated("renamed fsdpp::IndexedOptimizerStateDict")]] = IndexedOptimizerStateDict;

}  // namespace fsdpp
