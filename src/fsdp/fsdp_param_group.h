#pragma once
// One FSDP unit's parameters: the flat sharded buffer (this rank's padded chunks, which the
// parameters view at rest), the all-gather into one flat buffer and the copy-out into the
// unsharded buffer (which the parameters view during compute), and the reduce-scatter of
// gradients into shard-shaped `.grad`.
//
// Layouts, with S = sum of the parameters' padded chunk sizes and N = group size:
//   sharded flat [S]:        param 0 chunk | param 1 chunk | ...    (offsets shard_offset)
//   all-gather output [N*S]: rank 0's sharded flat | rank 1's | ...
//   unsharded flat [N*S]:    param 0 all rows (padded) | param 1 all rows | ...
//   post-forward shard [N/k*S]: with reshard_after_forward = k, the all-gather output's
//                            chunks of ranks [j*N/k, (j+1)*N/k) for member j of this rank's
//                            k-rank post-forward group (consecutive ranks), so an all-gather
//                            over that group rebuilds the all-gather output for backward.
// The unsharded flat keeps one storage for the unit's life; resharding frees its memory
// (the storage shrinks to 0 bytes) and unsharding reallocates it, so views that autograd
// saved during forward see the regathered values in backward.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/process_group.h>
#include <fsdpp/reshard_policy.h>
#include <fsdpp/work.h>

#include "fsdp/fsdp_param.h"

namespace fsdpp::detail {

// Sleeps the engine takes before issuing its collectives: tests set rank-dependent values
// to shake out ordering assumptions (seed 001's delay_before_all_gather and
// delay_before_reduce_scatter). Zero outside tests.
struct FSDPTestingDelays {
  int before_all_gather_ms = 0;
  int before_reduce_scatter_ms = 0;
};
FSDPTestingDelays& testing_delays();

class FSDPParamGroup {
 public:
  // The policy is checked against the group by the caller.
  FSDPParamGroup(std::vector<std::pair<std::string, at::Tensor>> params, ProcessGroup group, std::string unit_name,
                 ReshardPolicy reshard_after_forward = {});
  ~FSDPParamGroup();
  FSDPParamGroup(const FSDPParamGroup&) = delete;
  FSDPParamGroup& operator=(const FSDPParamGroup&) = delete;

  const std::vector<FSDPParam>& fsdp_params() const { return params_; }
  const ProcessGroup& process_group() const { return process_group_; }
  int64_t sharded_numel() const { return shard_numel_; }
  int64_t unsharded_numel() const { return shard_numel_ * world_size_; }

  // Starts the all-gather (asynchronously) unless unsharded or already started. With
  // use_post_forward_shard it gathers from the k-way post-forward shard when one is kept
  // (backward); otherwise that shard is dropped and the gather uses the true shards.
  void unshard(bool use_post_forward_shard = false);
  // Waits for the all-gather and makes the parameters views into the unsharded buffer.
  void wait_for_unshard();
  bool is_unsharded() const { return unsharded_; }
  bool unshard_in_flight() const { return all_gather_output_.defined(); }
  // Parameters back to shards; frees the unsharded memory (and any post-forward shard).
  void reshard();
  // Copies this rank's rows of the unsharded parameters into the shards (summon_full_params
  // with writeback).
  void write_back_unsharded();
  // After forward, as the reshard policy says: nothing, reshard, or reshard keeping the k-way
  // post-forward shard.
  void reshard_after_forward();
  bool has_post_forward_shard() const { return post_forward_shard_.defined(); }
  // set_reshard_after_forward: a bool from now on (no post-forward shard).
  void set_reshard_after_forward(bool v) { reshard_policy_ = v; post_forward_size_ = 0; }

  // Takes the full gradients the unit's backward left in `.grad`, starts the reduce-scatter
  // of their average and reshards. Returns false when no parameter had a gradient.
  bool post_backward();
  // Waits for the reduce-scatter and writes (or adds) each parameter's gradient shard.
  void finalize_backward();
  bool reduce_scatter_in_flight() const { return reduce_scatter_output_.defined(); }
  // In flight and finished on the wire: finalize_backward() will not block.
  bool reduce_scatter_done() const { return reduce_scatter_output_.defined() && reduce_scatter_work_.is_completed(); }

  // Off: post_backward keeps the full gradients (summed over backwards) instead of
  // reduce-scattering them; the next post_backward with it on reduces the sum.
  void set_requires_gradient_sync(bool v) { requires_gradient_sync_ = v; }
  // Off: a backward without gradient sync leaves the parameters unsharded (the next forward
  // gathers nothing). A backward that syncs always reshards: `.grad` is shard-shaped.
  void set_reshard_after_backward(bool v) { reshard_after_backward_ = v; }
  // Waits for and drops an all-gather nobody used (a prefetch for a unit that did not run).
  void drop_pending_unshard();
  bool requires_gradient_sync() const { return requires_gradient_sync_; }

 private:
  // Follows a cast of the parameters (module->to(dtype) after wrapping): new flat buffers
  // in the new dtype.
  void handle_dtype_change();
  // Throws if the ranks' parameters (names, shapes, dtypes) of this unit differ.
  void check_same_on_all_ranks();
  // New flat sharded and unsharded buffers with `options`, the parameters bound to them
  // (initial: their current full values are sharded; else their shards move over).
  void bind_flat_buffers(const at::TensorOptions& options, bool initial);
  void allocate_unsharded();
  void free_unsharded();
  void drop_post_forward_shard();

  std::string unit_name_;
  ProcessGroup process_group_;
  int rank_ = 0;
  int world_size_ = 1;
  std::vector<FSDPParam> params_;
  std::vector<int64_t> shard_offsets_;
  std::vector<int64_t> unsharded_offsets_;
  int64_t shard_numel_ = 0;
  at::Tensor sharded_flat_;
  at::Tensor unsharded_flat_;
  bool unsharded_ = false;

  ReshardPolicy reshard_policy_;
  int post_forward_size_ = 0;  // k of the post-forward shard, 0 when none is kept
  ProcessGroup post_forward_group_;
  at::Tensor post_forward_shard_;

  Work all_gather_work_;
  at::Tensor all_gather_output_;

  Work reduce_scatter_work_;
  at::Tensor reduce_scatter_input_;
  at::Tensor reduce_scatter_output_;
  std::vector<char> had_grad_;
  bool requires_gradient_sync_ = true;
  bool reshard_after_backward_ = true;
  std::vector<at::Tensor> accumulated_grads_;  // full-shaped, while sync is off
};

}  // namespace fsdpp::detail
