#pragma once
// The checkpoint wrapper apply_activation_checkpointing puts in place of a Sequential element it
// knows only through its AnyModule: it takes and returns the Sequential's AnyValues.
#include <vector>

#include <torch/nn/modules/container/any.h>

#include "nn/pass_through_holder.h"

namespace fsdpp::detail {

class AnyCheckpointWrapperImpl : public torch::nn::Module {
 public:
  explicit AnyCheckpointWrapperImpl(torch::nn::AnyModule module);
  torch::nn::AnyValue forward(std::vector<torch::nn::AnyValue> arguments);

 private:
  torch::nn::AnyModule module_;
};

}  // namespace fsdpp::detail

FSDPP_PASS_THROUGH_ANY_MODULE(AnyCheckpointWrapperImpl);
