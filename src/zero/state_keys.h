#pragma once
// Private helpers shared by the ZeRO sources.
#include <string>

#include <ATen/core/Tensor.h>

namespace fsdpp::detail {

// The key under which libtorch's optimizers keep a parameter's state (its TensorImpl address).
std::string optimizer_state_key(const at::Tensor& param);

}  // namespace fsdpp::detail
