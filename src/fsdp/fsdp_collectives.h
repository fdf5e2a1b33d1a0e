#pragma once
// The byte layouts of one FSDP unit's collectives (FSDP2's _fsdp_collectives): where each
// parameter sits in the unit's flat buffers, where the all-gather puts each rank's chunks, the
// k-way post-forward shard, the reduce-scatter input and the gradient shards in its output.
// FSDPParamGroup decides when these run; this file says what goes where.
//
// With S = the sum of the parameters' padded chunk sizes and N = the group size:
//   sharded flat [S]:           param 0 chunk | param 1 chunk | ...      (shard_offset(i))
//   unsharded flat [N*S]:       param 0 all rows (padded) | param 1 ... (unsharded_offset(i));
//                               the all-gather puts each rank's chunks here (gather_layout)
//   reduce-scatter input [N*S]: rank 0's rows of each gradient | rank 1's | ... (rank-major)
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/process_group.h>

#include "comm/gather_layout.h"
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
  // Where an all-gather of sharded flats (blocks_per_member of them per member: the k-way
  // post-forward shard) puts each rank's chunk of each parameter: its rows in the unsharded flat.
  GatherLayout gather_layout(int64_t blocks_per_member = 1) const;

 private:
  int world_size_ = 1;
  int64_t shard_numel_ = 0;
  std::vector<int64_t> shard_offsets_;
};

// The post-forward shard of reshard_after_forward = k: the sharded flats of the `per_member`
// ranks from `first_rank` on, one after another, taken from the unsharded parameters, so an
// all-gather over the k-rank post-forward group (gather_layout(per_member)) rebuilds them all.
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
