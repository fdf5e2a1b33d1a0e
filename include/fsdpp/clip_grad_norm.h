#pragma once
// Gradient-norm clipping of sharded models: FSDP1's FullyShardedDataParallel.clip_grad_norm_
// and torch.nn.utils.clip_grad_norm_ over FSDP2's DTensor parameters. See docs/api.md,
// "Gradient clipping".
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <fsdpp/distributed_data_parallel.h>

namespace fsdpp {

// Clips the gradients of `module`'s parameters in place so that their total norm of order
// `norm_type` (2, 1, any p > 0, or infinity) is at most `max_norm`, and returns the total norm
// before clipping: a 0-dim tensor in float32 (float64 if a parameter is float64), on the first
// parameter's device.
//
// The total norm is the norm over the whole model's gradients, each element counted once:
// gradients of FSDP-sharded parameters (every unit inside `module`, the module itself
// included) are reduced over their unit's shard group (padding never counts; under HSDP /
// NO_SHARD the replicas, equal after the replicate all-reduce, are not reduced over);
// parameters no unit shards (ignored parameters, DDP's or a plain module's) count this rank's
// gradient once. Every rank then multiplies its gradients by
// clip_coef = min(1, max_norm / (total_norm + 1e-6)), as PyTorch does. Parameters without a
// gradient are skipped.
//
// Collective over the shard groups of the units inside `module` (one all-reduce per distinct
// group of more than one rank): every rank of them must call it. A DDP or plain module
// communicates nothing.
//
// error_if_nonfinite: a total norm that is NaN or infinite throws fsdpp::Error (on every
// rank, after the reduction, naming this rank's parameters whose gradient is non-finite);
// nothing is scaled then.
at::Tensor clip_grad_norm_(torch::nn::Module& module, double max_norm, double norm_type = 2.0,
                           bool error_if_nonfinite = false);

// For module holders (fsdpp::FullyShardedDataParallel<...>, torch::nn::Sequential, ...).
template <class M>
at::Tensor clip_grad_norm_(const torch::nn::ModuleHolder<M>& module, double max_norm, double norm_type = 2.0,
                           bool error_if_nonfinite = false) {
  return clip_grad_norm_(*module.ptr(), max_norm, norm_type, error_if_nonfinite);
}

// For DDP (fsdpp::replicate, any DistributedDataParallel<M>): its gradients are equal on every
// rank after backward, so this clips model.module() locally (no communication). A template so
// that nothing converts to a DDP implicitly (DDP's constructor takes a module).
template <class M>
at::Tensor clip_grad_norm_(const DistributedDataParallel<M>& model, double max_norm, double norm_type = 2.0,
                           bool error_if_nonfinite = false) {
  return clip_grad_norm_(*model.module(), max_norm, norm_type, error_if_nonfinite);
}

}  // namespace fsdpp
