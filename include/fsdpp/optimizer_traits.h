#pragma once
// The types behind a torch::optim optimizer: its options and its per-parameter state.
// ZeroRedundancyOptimizer<O> wraps any optimizer with traits; the named optimizer state dicts
// (<fsdpp/state_dict.h>) build their per-optimizer tables from the same traits.
#include <type_traits>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace fsdpp {

// Built in for libtorch's SGD, Adam, AdamW, RMSprop and Adagrad and every class derived from
// them; specialize it for an optimizer that derives directly from torch::optim::Optimizer:
//   template <> struct fsdpp::OptimizerTraits<MyOpt> { using Options = MyOptions; using ParamState = MyParamState; };
template <typename O, typename Enable = void>
struct OptimizerTraits;

#define FSDPP_OPTIMIZER_TRAITS(Opt)                                                            \
  template <typename O>                                                                        \
  struct OptimizerTraits<O, std::enable_if_t<std::is_base_of<torch::optim::Opt, O>::value>> { \
    using Options = torch::optim::Opt##Options;                                                \
    using ParamState = torch::optim::Opt##ParamState;                                          \
  };
FSDPP_OPTIMIZER_TRAITS(SGD)
FSDPP_OPTIMIZER_TRAITS(Adam)
FSDPP_OPTIMIZER_TRAITS(AdamW)
FSDPP_OPTIMIZER_TRAITS(RMSprop)
FSDPP_OPTIMIZER_TRAITS(Adagrad)
#undef FSDPP_OPTIMIZER_TRAITS

}  // namespace fsdpp
