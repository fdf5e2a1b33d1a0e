#pragma once
// The key of torch::optim::Optimizer::state(): the parameter's TensorImpl address printed as a
// string in libtorch 1.13, the TensorImpl* itself in 2.x.
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace fsdpp::compat {

using OptimizerStateKey =
    std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// The key under which libtorch's optimizers keep `param`'s state.
OptimizerStateKey optimizer_state_key(const at::Tensor& param);

}  // namespace fsdpp::compat
