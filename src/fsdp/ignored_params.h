#pragma once
// The parameters a unit leaves alone (FSDP2's ignored_params, FSDP1's ignored_modules): whole
// on every rank, never gathered, their gradients not reduced.
#include <string>
#include <unordered_set>

#include <torch/nn/module.h>

#include <fsdpp/fully_shard.h>

namespace fsdpp::detail {

// The TensorImpls of the parameters `options` ignores in `module`. Throws naming `unit` and
// the offending entry if an ignored parameter is not a parameter of `module`, or an ignored
// module is neither `module` nor inside it; nothing has changed then.
std::unordered_set<const c10::TensorImpl*> ignored_parameters(const torch::nn::Module& module,
                                                              const FullyShardOptions& options, const std::string& unit);

// Whether `m` is one of the ignored modules (an auto-wrap policy makes no unit of it).
bool is_ignored_module(const FullyShardOptions& options, const torch::nn::Module& m);

// The options for a unit made of `submodule` by an auto-wrap policy: the ignored lists keep
// what `submodule` holds, so the inner unit ignores those and accepts its options.
FullyShardOptions options_within(FullyShardOptions options, const torch::nn::Module& submodule);

}  // namespace fsdpp::detail
