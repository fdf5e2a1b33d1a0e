#pragma once
// A type-blind module's call under checkpointed_call: what the type-blind checkpoint wrapper and
// a type-blind FSDP unit checkpointing its wrapped module both run.
#include <string>
#include <vector>

#include <torch/nn/modules/container/any.h>

namespace fsdpp::detail {

// module(arguments...) recomputed in backward; the tensors among `arguments` are the inputs, the
// output must be a tensor. Errors name `who`.
torch::nn::AnyValue checkpointed_any_call(torch::nn::AnyModule module, std::vector<torch::nn::AnyValue> arguments,
                                          const std::string& who);

}  // namespace fsdpp::detail
