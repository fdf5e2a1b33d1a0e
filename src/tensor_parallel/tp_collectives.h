#pragma once
// The differentiable collectives of tensor parallelism (Megatron's f and g operators, PyTorch's
// DTensor redistributions between Replicate, Shard(d) and Partial on the TP group), each the
// other's backward. Shards follow torch.chunk: rank r holds ceil(n / size) slices of a dim of
// n, the last ranks fewer or none; parts travel padded to that chunk.
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include <fsdpp/process_group.h>

namespace fsdpp::detail {

// What a Replicate tensor's gradient is when it reaches the redistribution that made it.
enum class TPGrad {
  Replicated,  // the same on every rank (every consumer already reduced its part)
  Partial,     // this rank's share of a sum (the consumer is a rank-local op on sharded weights)
};

// Replicate in, to be used by a rank-local op: identity; backward all-reduces (sums) the
// gradient, the partial gradients of the ranks' parts.
at::Tensor tp_copy_to_parallel(const at::Tensor& x, const ProcessGroup& group);

// Partial -> Replicate: all-reduce (sum); backward identity.
at::Tensor tp_reduce_from_parallel(const at::Tensor& x, const ProcessGroup& group);

// Shard(dim) -> Replicate: all-gathers the ranks' parts of `dim`, of global size `extent`; an
// `extent` of -1 means unknown: the ranks' sizes are all-gathered first (and must be torch.chunk's
// parts of their sum). Backward keeps this rank's part of a Replicated gradient, or
// reduce-scatters a Partial one. `who` names the module in errors.
at::Tensor tp_gather(const at::Tensor& x, int64_t dim, int64_t extent, TPGrad grad, const ProcessGroup& group,
                     const std::string& who);

// Replicate -> Shard(dim): this rank's part of `dim`; backward all-gathers the gradient.
at::Tensor tp_split(const at::Tensor& x, int64_t dim, const ProcessGroup& group);

// Partial -> Shard(dim): reduce-scatters (sums) the ranks' partial tensors along `dim`; backward
// all-gathers the gradient.
at::Tensor tp_reduce_scatter(const at::Tensor& x, int64_t dim, const ProcessGroup& group);

// `dim` of a tensor of `ndim` dims, counted from the front; an error naming `who` when out of range.
int64_t tp_normalize_dim(int64_t dim, int64_t ndim, const std::string& who);

}  // namespace fsdpp::detail
