#pragma once
// Which module a parallel style applies to, and with which layouts: checked for the whole plan
// before parallelize_module changes anything.
#include <string>

#include <torch/nn/module.h>

#include <fsdpp/tensor_parallel.h>

namespace fsdpp::detail {

// The style's name ("ColwiseParallel").
const char* style_name(const ParallelStyle& style);

// Throws an fsdpp::Error starting with `who` when `style` cannot apply to `module` (the plain
// module, not its wrapper).
void check_style_applies(const ParallelStyle& style, const torch::nn::Module& module, const std::string& who);

}  // namespace fsdpp::detail
