#pragma once
// Where one FSDP unit's bytes lie: each parameter's place in the unit's flat buffers, where an
// all-gather puts each rank's chunks, the k-way post-forward shard, the reduce-scatter input and
// the gradient shards in its output (the padded layouts), and the LOCAL state dict's flat
// parameter (the unpadded one). fsdp_collectives issues the collectives over these buffers;
// FSDPParamGroup decides when.
//
// With S = the sum of the parameters' padded chunk sizes and N = the group size:
//   sharded flat [S]:           param 0 chunk | param 1 chunk | ...      (shard_offset(i))
//   unsharded flat [N*S]:       param 0 all rows (padded) | param 1 ... (unsharded_offset(i));
//                               the all-gather puts each rank's chunks here (gather_layout)
//   reduce-scatter input [N*S]: rank 0's rows of each gradient | rank 1's | ... (rank-major)
//   LOCAL flat [sum of numel]:  param 0 | param 1 | ... unpadded, each rank holding its rows
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/process_group.h>
#include <fsdpp/sharded_tensor.h>

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

  // The post-forward shard of reshard_after_forward = k: the sharded flats of the `per_member`
  // ranks from `first_rank` on, one after another, taken from the unsharded parameters, so an
  // all-gather over the k-rank post-forward group (gather_layout(per_member)) rebuilds them all.
  at::Tensor post_forward_shard(const std::vector<FSDPParam>& params, int64_t first_rank, int64_t per_member,
                                const at::TensorOptions& options) const;
  // The reduce-scatter input: each rank's rows of each full gradient (zeros for a parameter
  // whose gradient is undefined). Each gradient handle is released once packed, so its memory
  // can go.
  at::Tensor reduce_scatter_input(const std::vector<FSDPParam>& params, std::vector<at::Tensor>& grads,
                                  const at::TensorOptions& options) const;
  // Parameter i's gradient shard (shaped as its local shard) in a reduce-scatter output.
  at::Tensor gradient_shard(const std::vector<FSDPParam>& params, const at::Tensor& output, size_t i) const;

  // The LOCAL flat parameter: the parameters flattened and concatenated without padding, each
  // parameter's rows on the rank that holds them (a copy of this rank's). No communication.
  ShardedTensor local_flat_value(const std::vector<FSDPParam>& params, at::ScalarType dtype,
                                 const ProcessGroup& group) const;
  // Each parameter's rows on this rank (shaped as its shard) from a LOCAL flat value, which may
  // be sharded another way (then its full_tensor(): collective over its group).
  std::vector<at::Tensor> local_rows_from_flat(const std::vector<FSDPParam>& params, const ShardedTensor& flat,
                                               int rank, const std::string& unit_name) const;

 private:
  std::vector<ShardMetadata> local_flat_shards(const std::vector<FSDPParam>& params) const;

  int world_size_ = 1;
  int64_t shard_numel_ = 0;
  std::vector<int64_t> shard_offsets_;
};

}  // namespace fsdpp::detail
