#pragma once
// The differentiable collectives of tensor parallelism (Megatron's f and g operators, PyTorch's
// DTensor redistributions between Replicate, Shard(-1) and Partial on the TP group), each the
// other's backward.
#include <cstdint>

#include <ATen/core/Tensor.h>

#include <fsdpp/process_group.h>

namespace fsdpp::detail {

// Replicate in, to be used by a rank-local op: identity; backward all-reduces (sums) the
// gradient, the partial gradients of the ranks' parts.
at::Tensor tp_copy_to_parallel(const at::Tensor& x, const ProcessGroup& group);

// Partial -> Replicate: all-reduce (sum); backward identity.
at::Tensor tp_reduce_from_parallel(const at::Tensor& x, const ProcessGroup& group);

// Shard(-1) -> Replicate: all-gathers the ranks' parts of a last dim of global size `extent`
// (torch.chunk parts, padded on the wire); backward keeps this rank's part of the gradient.
at::Tensor tp_gather_last_dim(const at::Tensor& x, int64_t extent, const ProcessGroup& group);

// Replicate -> Shard(-1): this rank's torch.chunk part of the last dim; backward all-gathers.
at::Tensor tp_split_last_dim(const at::Tensor& x, const ProcessGroup& group);

}  // namespace fsdpp::detail
