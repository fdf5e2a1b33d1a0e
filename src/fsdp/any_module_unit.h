#pragma once
// The unit a type-blind wrap policy makes of a Sequential element: it knows the element only
// through its AnyModule and takes and returns AnyValues, so the Sequential calls it in place.
#include <vector>

#include <torch/nn/modules/container/any.h>

#include <fsdpp/fully_shard.h>

#include "nn/pass_through_holder.h"

namespace fsdpp::detail {

class AnyModuleUnitImpl : public FSDPModule {
 public:
  AnyModuleUnitImpl(torch::nn::AnyModule module, FullyShardOptions options);
  torch::nn::AnyValue forward(std::vector<torch::nn::AnyValue> arguments);

 private:
  torch::nn::AnyModule module_;
};

}  // namespace fsdpp::detail

FSDPP_PASS_THROUGH_ANY_MODULE(AnyModuleUnitImpl);
