#pragma once
// Overlapping DDP with ZeRO (PyTorch's torch.distributed.algorithms.ddp_comm_hooks.
// ddp_zero_hook: hook_with_zero_step, hook_with_zero_step_interleaved).
//
//   fsdpp::DistributedDataParallel ddp(model, fsdpp::DistributedDataParallelOptions().bucket_cap_mb(1));
//   fsdpp::ZeroRedundancyOptimizer<torch::optim::Adam> zero(model->parameters(), torch::optim::AdamOptions(1e-3));
//   fsdpp::hook_with_zero_step(ddp, zero);   // collective, once, before the first backward
//   for (...) {
//     zero.zero_grad();
//     loss_fn(ddp.forward(x), y).backward();  // each bucket is stepped (and broadcast) during backward
//     zero.step();                            // optional: a no-op
//   }
//
// Both functions re-partition `zero` by DDP bucket (bucket b belongs to group rank
// b % world_size; with `shard_buckets`, as PyTorch's shard_buckets=True, a bucket may be split
// among ranks to even out their shares: ZeroRedundancyOptimizerBase::partition_by_buckets says
// how) and make a second
// process group with DDP's ranks (ProcessGroup::new_group, so every rank must call them, in
// the same order relative to other new_group calls) for the parameter broadcasts. During
// backward, once bucket b's gradients are averaged, its owner runs the wrapped optimizer on
// the bucket's parameters and broadcasts them to the other ranks on that group; by the end of
// backward every parameter holds its updated value on every rank. zero.step() is then a
// no-op. Neither function can be undone.
//
// Requirements: `zero` optimizes exactly the parameters DDP reduces (the module's parameters
// that require a gradient), over the same ranks, with parameters_as_bucket_view off, and has
// not stepped yet. A parameter is updated in place during backward once its gradient is
// final, so a parameter must not be needed by the rest of the backward (e.g. also used
// through .detach() elsewhere in the graph, or a second backward through a retained graph).
// Join (uneven inputs) is not supported: zero.step() is a no-op, so a joined rank would not
// match the broadcasts.
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/zero_redundancy_optimizer.h>

namespace fsdpp {

// Steps bucket b in a bucket-reduced callback (register_bucket_reduced_callback): after the
// bucket's reduction completed and `.grad` holds the averaged gradient, in bucket order, on
// the thread running backward (during backward when DDP sees the reduction done, otherwise
// at the end of backward). The comm hook stays free: register_comm_hook may still be used.
// Works with find_unused_parameters (a parameter no rank used keeps its `.grad`, and is
// skipped if that is undefined).
void hook_with_zero_step(DistributedDataParallel<>& ddp, ZeroRedundancyOptimizerBase& zero,
                         bool shard_buckets = false);

// Installs a comm hook (so none may be registered before or after) that reduces bucket b
// (all_reduce, AVG, on DDP's group), waits for it, and immediately steps the bucket and
// broadcasts it, before returning to backward: reduction and step interleave bucket by
// bucket, and bucket b's step has happened as soon as its gradients are all ready. This
// serializes each reduction with the rest of backward (no communication overlap beyond the
// step itself). Not supported with find_unused_parameters.
void hook_with_zero_step_interleaved(DistributedDataParallel<>& ddp, ZeroRedundancyOptimizerBase& zero,
                                     bool shard_buckets = false);

}  // namespace fsdpp
