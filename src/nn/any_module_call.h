#pragma once
// Calling an AnyModule with the values a Sequential hands its element (type-blind wrappers).
#include <string>
#include <vector>

#include <torch/nn/modules/container/any.h>

namespace fsdpp::detail {

// m.any_forward(arguments...) for up to 6 arguments; more is an error naming `who`.
torch::nn::AnyValue call_any_module(torch::nn::AnyModule& m, std::vector<torch::nn::AnyValue>& arguments,
                                    const std::string& who);

}  // namespace fsdpp::detail
