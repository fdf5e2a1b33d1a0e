#pragma once
// The key of torch::optim::Optimizer::state(), as libtorch spells it (the parameter's TensorImpl*
// in every supported release); fsdpp names it through this seam only.
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace fsdpp::compat {

using OptimizerStateKey =
    std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// The key under which libtorch's optimizers keep `param`'s state.
inline OptimizerStateKey optimizer_state_key(const at::Tensor& param) { return param.unsafeGetTensorImpl(); }

}  // namespace fsdpp::compat
