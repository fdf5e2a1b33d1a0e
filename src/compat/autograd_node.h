#pragma once
// How libtorch holds an autograd graph node: std::shared_ptr<Node> in 2.6, c10::intrusive_ptr<Node>
// in 2.15. Named once, from what grad_accumulator returns.
#include <utility>

#include <torch/csrc/autograd/variable.h>

namespace fsdpp::compat {

using AutogradNodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

}  // namespace fsdpp::compat
