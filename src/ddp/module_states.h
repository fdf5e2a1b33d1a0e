#pragma once
// A module's parameters and buffers as DDP syncs them across ranks (PyTorch's
// _sync_module_states): each tensor once, broadcast coalesced. Private to fsdpp.
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <fsdpp/process_group.h>

namespace fsdpp::detail {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};
using NamedTensors = std::vector<NamedTensor>;

// Each tensor once, in registration order (a shared parameter appears under its first name).
NamedTensors unique_named(const torch::OrderedDict<std::string, at::Tensor>& dict);
std::vector<at::Tensor> tensors_of(const NamedTensors& named);

// Overwrites the tensors with group rank `root`'s values, coalesced per dtype and device into
// buffers of at most 256 MiB. Every rank passes the same tensors in the same order.
void broadcast_coalesced(const std::vector<at::Tensor>& tensors, int root, const ProcessGroup& group);

}  // namespace fsdpp::detail
