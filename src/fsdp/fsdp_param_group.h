#pragma once
// One FSDP unit's state machine (FSDP2's FSDPParamGroup): sharded, gathering (all-gather in
// flight), unsharded, and resharded after forward (maybe keeping the k-way post-forward shard);
// then, in backward, gradient accumulation and the reduction of the gradients into
// shard-shaped `.grad`. fsdp_param_group.cpp decides when; the flat buffers' byte layouts are in
// unit_flat_layout, the collectives are issued, waited for and placed by fsdp_collectives, and
// construction (the ranks' model check, sync_module_states) and deferred materialization are in
// fsdp_param_group_init.cpp.
// The unsharded flat keeps one storage for the unit's life; resharding frees its memory
// (the storage shrinks to 0 bytes) and unsharding reallocates it, so views that autograd
// saved during forward see the regathered values in backward.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/fully_shard_options.h>
#include <fsdpp/process_group.h>
#include <fsdpp/sharded_tensor.h>
#include <fsdpp/work.h>

#include "fsdp/fsdp_collectives.h"
#include "fsdp/fsdp_param.h"
#include "fsdp/unit_flat_layout.h"
#include "fsdp/unit_groups.h"

namespace fsdpp::detail {

// What an all-gather is for: forward, backward (which may gather from the k-way post-forward
// shard), or summon_full_params (the parameters' own dtype, whatever the mixed-precision policy).
enum class UnshardFor { kForward, kBackward, kFullPrecision };

// Where the unit's parameters are (FSDP2's ShardedState): this rank's shards; the shards and
// the k-way post-forward shard kept for backward's gather; or views into the unsharded flat.
enum class ShardedState { kSharded, kShardedPostForward, kUnsharded };

// What fully_shard's options say about one unit's memory and collectives.
struct ParamGroupPolicies {
  ReshardPolicy reshard_after_forward;
  MixedPrecisionPolicy mp_policy;
  OffloadPolicy offload_policy;
  bool sync_module_states = false;
  std::optional<at::Device> device_id;  // checked by the caller against the parameters' device
};

class FSDPParamGroup {
 public:
  // The policies are checked by the caller. The compute device is device_id, else the
  // parameters' device (the CPU for parameters on the meta device, which are deferred).
  // Parameters are sharded across groups.shard; under HSDP each reduced gradient shard is then
  // averaged across groups.replicate.
  // `trace_name` tells units apart in profiler spans (unit names are module type names).
  FSDPParamGroup(std::vector<std::pair<std::string, at::Tensor>> params, UnitGroups groups, std::string unit_name,
                 std::string trace_name, const ParamGroupPolicies& policies = {});
  ~FSDPParamGroup();
  FSDPParamGroup(const FSDPParamGroup&) = delete;
  FSDPParamGroup& operator=(const FSDPParamGroup&) = delete;

  const std::vector<FSDPParam>& fsdp_params() const { return params_; }
  const ProcessGroup& process_group() const { return process_group_; }
  int64_t unsharded_numel() const { return flat_layout_.unsharded_numel(); }
  // Bytes of the unsharded parameters as computed with (the gather's output, and the gradients
  // backward produces), and of the reduce-scatter input.
  int64_t unsharded_compute_bytes() const;
  int64_t unsharded_reduce_bytes() const;

  // Starts the all-gather (asynchronously) unless unsharded or already started. For backward
  // it gathers from the k-way post-forward shard when one is kept; otherwise that shard is
  // dropped and the gather uses the true shards.
  void unshard(UnshardFor purpose = UnshardFor::kForward);
  // Waits for the all-gather and makes the parameters views into the unsharded buffer.
  void wait_for_unshard();
  bool is_unsharded() const { return sharded_state_ == ShardedState::kUnsharded; }
  // Unsharded for compute in a dtype other than the parameters' own (mixed precision), not by
  // summon_full_params's full-precision gather.
  bool unsharded_below_full_precision() const {
    return is_unsharded() && !full_precision_flat_.defined() && unsharded_flat_.scalar_type() != sharded_flat_.scalar_type();
  }
  // Parameters back to shards; frees the unsharded memory (and any post-forward shard).
  void reshard();
  // Copies this rank's rows of the unsharded parameters into the shards (summon_full_params
  // with writeback).
  void write_back_unsharded();
  // After forward, as the reshard policy says: nothing, reshard, or reshard keeping the k-way
  // post-forward shard.
  void reshard_after_forward();
  const ReshardPolicy& reshard_policy() const { return reshard_policy_; }
  // Deferred init (materialize_module; fsdp_param_group_init.cpp): the unit's full parameters,
  // in their own dtype, on this rank alone (no collective) while `init` writes them; then this
  // rank's rows become the shards and the full copy is freed. The parameters were built on the
  // meta device and hold no values until this or mark_materialized (to_empty: a checkpoint
  // load fills the shards).
  void materialize(const std::function<void()>& init);
  bool deferred() const { return deferred_; }
  const at::Device& compute_device() const { return compute_device_; }
  void mark_materialized() { deferred_ = false; }
  // set_reshard_after_forward: a bool from now on (no post-forward shard).
  void set_reshard_after_forward(bool v) { reshard_policy_ = ReshardPolicy(v); }

  // Takes the full gradients the unit's backward left in `.grad`, starts the reduce-scatter
  // of their average and reshards. Under HSDP (all-reduce on) also issues the all-reduce of
  // its output across the replicas, chained after it on the comm threads (FSDP2's
  // foreach_reduce), so that backward's compute overlaps both. Calls `after_release` once the
  // unit is done with its gradients (packed, or summed into the accumulation) and its
  // parameters (resharded, unless reshard_after_backward is off), before any reduce-scatter.
  // Returns false when no parameter had a gradient.
  bool post_backward(const std::function<void()>& after_release);
  // Waits for the reduce-scatter (and the replicate all-reduce) and writes (or adds) each
  // parameter's gradient shard. Starts no collective.
  void finalize_backward();
  // In flight and finished on the wire: finalize_backward() will not block. Never under HSDP:
  // there the end of backward waits for the reduce-scatter and its all-reduce, so that a failed
  // all-reduce throws at the same point on every rank (thrown mid-backward on one rank only, it
  // could leave a peer waiting for a reduce-scatter this rank would no longer issue).
  bool reduce_scatter_done() const { return gradient_reduce_.done(); }
  // The streams of its tree's collectives (the root's lazy init shares the root's).
  const std::shared_ptr<FSDPCommContext>& comm_context() const { return comm_context_; }
  void use_comm_context(std::shared_ptr<FSDPCommContext> context) { comm_context_ = std::move(context); }

  // Off: post_backward keeps the full gradients (summed over backwards) instead of
  // reduce-scattering them; the next post_backward with it on reduces the sum.
  void set_requires_gradient_sync(bool v) { requires_gradient_sync_ = v; }
  // HSDP. Off: post_backward issues no all-reduce and finalize_backward keeps the reduce-scatter
  // output (summed over backwards) instead of writing `.grad`; the next post_backward with it
  // on adds the kept sum to its reduce-scatter output (on the comm thread) and all-reduces that.
  void set_requires_all_reduce(bool v) { requires_all_reduce_ = v; }
  // Off: a backward without gradient sync leaves the parameters unsharded (the next forward
  // gathers nothing). A backward that syncs always reshards: `.grad` is shard-shaped.
  void set_reshard_after_backward(bool v) { reshard_after_backward_ = v; }
  // Waits for and drops an all-gather nobody used (a prefetch for a unit that did not run).
  void drop_pending_unshard();

  // For state dicts. Each parameter's full value (a copy: views of one buffer of their own, which
  // the unit's own all-gather fills): the unit's state does not change. Collective.
  std::vector<at::Tensor> full_values() const;
  // The LOCAL state dict's flat parameter: the parameters flattened and concatenated, each
  // parameter's rows on the rank that holds them (a copy of this rank's). No communication.
  ShardedTensor flat_value() const;
  // Each parameter's rows on this rank (shaped as its shard) from a flat value, which may be
  // sharded another way (then its full_tensor(): collective over its group).
  std::vector<at::Tensor> local_rows_from_flat(const ShardedTensor& flat) const;

 private:
  // Follows a cast of the parameters (module->to(dtype) after wrapping): new flat buffers
  // in the new dtype.
  void handle_dtype_change();
  // New flat sharded and unsharded buffers with `options`, the parameters bound to them
  // (initial: their current full values are sharded; else their shards move over).
  void bind_flat_buffers(const at::TensorOptions& options, bool initial);
  // Points the parameters' unsharded views into `flat` (the unsharded flat layout).
  void bind_unsharded(const at::Tensor& flat);
  // The parameters' unsharded views back on the compute buffer, whose memory stays released
  // (views need a storage with bytes, so it is allocated for the moment).
  void rebind_compute_buffer();
  // sync_module_states (fsdp_param_group_init.cpp): the unit's full values on rank 0 of the
  // groups, broadcast to all, with the unsharded views bound to them (before the parameters
  // become shards).
  at::Tensor broadcast_from_rank0(at::ScalarType dtype);
  // The sharded flat buffer's options for `dtype`: on the host under CPU offload.
  at::TensorOptions sharded_options(at::ScalarType dtype) const;
  // The dtypes of the unsharded parameters and of the reduce-scatter (the sharded parameters'
  // dtype unless the mixed-precision policy names another), on the compute device.
  at::TensorOptions compute_options() const;
  at::TensorOptions reduce_options() const;
  // k of the post-forward shard the reshard policy keeps; 0 when none.
  int post_forward_size() const { return reshard_policy_.post_forward_size(world_size_); }
  // Waits for the gather in flight and, with `keep`, places it; without, or if it failed (then
  // rethrown), drops what it was filling.
  void finish_all_gather(bool keep);
  void drop_post_forward_shard();

  std::string unit_name_;
  std::string trace_name_;
  ProcessGroup process_group_;    // the shard group
  ProcessGroup replicate_group_;  // HSDP: defined, of more than one rank
  int rank_ = 0;
  int world_size_ = 1;
  std::vector<FSDPParam> params_;
  UnitFlatLayout flat_layout_;  // where the bytes lie in the two flat tensors below
  std::shared_ptr<const GatherLayout> gather_layout_;  // from sharded flats, or post-forward shards
  std::shared_ptr<const GatherLayout> post_forward_gather_layout_;
  at::Device compute_device_ = at::kCPU;
  OffloadPolicy offload_policy_;
  at::Tensor sharded_flat_;    // on the host under CPU offload, else on the compute device
  at::Tensor unsharded_flat_;  // in the compute dtype, on the compute device
  ShardedState sharded_state_ = ShardedState::kSharded;
  bool deferred_ = false;  // built on the meta device; no values yet
  std::optional<at::ScalarType> param_dtype_, reduce_dtype_;
  // summon_full_params under mixed precision: the gather is in the sharded dtype and the
  // parameters view this buffer until reshard.
  bool gathering_full_precision_ = false;
  at::Tensor full_precision_flat_;

  ReshardPolicy reshard_policy_;
  ProcessGroup post_forward_group_;
  at::Tensor post_forward_shard_;  // defined in ShardedState::kShardedPostForward only

  UnitAllGather all_gather_;
  UnitGradientReduce gradient_reduce_;
  // The streams its collectives run on: its own until the root's lazy init hands it the tree's.
  std::shared_ptr<FSDPCommContext> comm_context_ = std::make_shared<FSDPCommContext>();
  bool requires_gradient_sync_ = true;
  bool requires_all_reduce_ = true;
  bool reshard_after_backward_ = true;
  std::vector<at::Tensor> accumulated_grads_;  // full-shaped, while sync is off
};

}  // namespace fsdpp::detail
