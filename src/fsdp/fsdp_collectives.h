#pragma once
// The byte layouts of one FSDP unit's collectives (FSDP2's _fsdp_collectives): where each
// parameter sits in the unit's flat buffers, the copy-out after the all-gather, the k-way
// post-forward shard, the reduce-scatter input and the gradient shards in its output.
// FSDPParamGroup decides when these run; this file says what goes where.
//
// With S = the sum of the parameters' padded chunk sizes and N = the group size:
//   sharded flat [S]:           param 0 chunk | param 1 chunk | ...      (shard_offset(i))
//   all-gather output [N*S]:    rank 0's sharded flat | rank 1's | ...
//   unsharded flat [N*S]:       param 0 all rows (padded) | param 1 ... (unsharded_offset(i))
//   reduce-scatter input [N*S]: as the all-gather output, each rank's rows of each gradient
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/process_group.h>

#include "fsdp/fsdp_param.h"

namespace fsdpp::detail {

class UnitFlatLayout {
 public:
  UnitFlatLayout() = default;
  UnitFlatLayout(const std::vector<FSDPParam>& params, int world_size);

  int world_size() const { return world_size_; }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t unsharded_numel() const { return shard_numel_ * world_size_; }
  int64_t shard_offset(size_t i) const { return shard_offsets_[i]; }
  int64_t unsharded_offset(size_t i) const { return shard_offsets_[i] * world_size_; }

 private:
  int world_size_ = 1;
  int64_t shard_numel_ = 0;
  std::vector<int64_t> shard_offsets_;
};

// Copy-out: rank r's chunk of each parameter, from an all-gather output, to rows
// [r * chunk_rows, ...) of the parameter's region of `unsharded` (the unsharded flat layout).
void copy_out(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat, const at::Tensor& all_gather_output,
              const at::Tensor& unsharded);

// The post-forward shard of reshard_after_forward = k: the chunks of the `per_member` ranks
// from `first_rank` on, taken from the unsharded parameters, in all-gather output layout, so an
// all-gather over the k-rank post-forward group rebuilds the whole all-gather output.
at::Tensor post_forward_shard(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat, int64_t first_rank,
                              int64_t per_member, const at::TensorOptions& options);
// The k-rank post-forward group of this rank: consecutive ranks of `group` (cached on it).
ProcessGroup post_forward_group(const ProcessGroup& group, int k);

// The reduce-scatter input: each rank's rows of each full gradient (zeros for a parameter whose
// gradient is undefined). Each gradient handle is released once packed, so its memory can go.
at::Tensor reduce_scatter_input(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat,
                                std::vector<at::Tensor>& grads, const at::TensorOptions& options);
// Parameter i's gradient shard (shaped as its local shard) in a reduce-scatter output.
at::Tensor gradient_shard(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat, const at::Tensor& output,
                          size_t i);

}  // namespace fsdpp::detail
