// DDP + ZeRO overlap: the optimizer step of each DDP bucket runs during backward.
#include <string>
#include <unordered_map>
#include <vector>

#include <fsdpp/collectives.h>
#include <fsdpp/ddp_zero_hook.h>
#include <fsdpp/error.h>

namespace fsdpp {
namespace {

// Checks the pairing and partitions `zero` by DDP's buckets; returns the broadcast group.
ProcessGroup prepare(DistributedDataParallel<>& ddp, ZeroRedundancyOptimizerBase& zero, bool shard_buckets,
                     const std::string& fn) {
  const ProcessGroup& group = ddp.process_group();
  if (group.ranks() != zero.process_group().ranks())
    throw Error(fn + ": DDP and the ZeroRedundancyOptimizer must use process groups with the same ranks");
  auto named = ddp.module()->named_parameters();
  std::vector<std::vector<torch::Tensor>> buckets;
  for (const auto& names : ddp.bucket_parameter_names()) {
    buckets.emplace_back();
    for (const auto& name : names) buckets.back().push_back(named[name]);
  }
  try {
    zero.partition_by_buckets(buckets, shard_buckets);
  } catch (const Error& e) {
    throw Error(fn + ": " + e.what());
  }
  // All ranks call this in the same order, so this new_group lines up everywhere.
  return group.new_group(group.ranks());
}

}  // namespace

void hook_with_zero_step(DistributedDataParallel<>& ddp, ZeroRedundancyOptimizerBase& zero, bool shard_buckets) {
  ProcessGroup side = prepare(ddp, zero, shard_buckets, "hook_with_zero_step");
  ddp.register_bucket_reduced_callback([&zero, side](GradBucket& bucket) {
    // `.grad` holds the averaged gradient (or, for a parameter no rank used, what it held).
    zero.step_bucket(bucket.index(), {}, side);
  });
}

void hook_with_zero_step_interleaved(DistributedDataParallel<>& ddp, ZeroRedundancyOptimizerBase& zero,
                                     bool shard_buckets) {
  if (ddp.options().find_unused_parameters())
    throw Error("hook_with_zero_step_interleaved: not supported with find_unused_parameters (use hook_with_zero_step)");
  ProcessGroup side = prepare(ddp, zero, shard_buckets, "hook_with_zero_step_interleaved");
  ddp.register_comm_hook([&zero, side](GradBucket& bucket) {
    Work work = all_reduce(bucket.buffer(), ReduceOp::AVG, bucket.process_group(), /*async_op=*/true);
    work.wait();
    zero.step_bucket(bucket.index(), bucket.gradients(), side);
    return work;
  });
}

}  // namespace fsdpp
