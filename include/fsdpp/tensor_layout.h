#pragma once
// fsdpp::TensorLayout (PyTorch's DTensorSpec): a tensor's global shape and how it lies over a
// process group, Shard(d) or Replicate. It is the one place that says which part of a tensor a
// rank holds: FSDP shards every parameter by it (Shard(0)), and state dicts use it to cut a
// whole value into this rank's part, to describe a rank's part as a ShardedTensor and to
// redistribute a ShardedTensor sharded another way.
//
// Shard(d) follows torch.chunk: every rank's chunk has ceil(size(d) / N) slices along d (the
// extent FSDP pads each rank's storage to), so the last ranks hold fewer or none. A 0-dim
// tensor counts as one slice, held by rank 0 as shape [1] (others: [0]).
//   fsdpp::TensorLayout layout({5, 3}, fsdpp::Placement::shard(0), group);  // N = 2
//   layout.local_shape(1);             // {2, 3}: rows [3, 5)
//   at::Tensor mine = layout.local_of_full(whole);
//
// A layout over several mesh dimensions (2-D FSDP x TP: a TP Shard over the tp group, then
// FSDP's Shard(0) of each TP-local part over dp) is given as the block each rank of one group
// spanning the mesh holds (blocks()); placements() then lists one placement per mesh dimension.
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fsdpp/placement.h>
#include <fsdpp/process_group.h>
#include <fsdpp/sharded_tensor.h>

namespace fsdpp {

class TensorLayout {
 public:
  TensorLayout() = default;
  TensorLayout(std::vector<int64_t> global_shape, Placement placement, ProcessGroup group);
  // Over several mesh dimensions: `blocks[r]` is what group rank r holds (its placement r; a
  // block may be empty). The blocks must tile the tensor without overlap.
  TensorLayout(std::vector<int64_t> global_shape, std::vector<Placement> placements, ProcessGroup group,
               std::vector<ShardMetadata> blocks);

  const std::vector<int64_t>& global_shape() const { return global_shape_; }
  // One per mesh dimension (a process group is a 1-D mesh).
  const std::vector<Placement>& placements() const { return placements_; }
  const ProcessGroup& process_group() const { return group_; }
  int64_t numel() const;

  // Whether the layout was given as blocks (several mesh dimensions).
  bool is_blocks() const { return !blocks_.empty(); }
  // Every rank's block, in group-rank order (layouts given as blocks only).
  const std::vector<ShardMetadata>& blocks() const { return blocks_; }
  // Along the sharded dim (one Shard placement only): slices per rank's chunk, and what `rank` holds.
  int64_t chunk_size() const { return chunk_; }
  int64_t local_size(int rank) const;
  int64_t local_offset(int rank) const;
  // The shape of `rank`'s part.
  std::vector<int64_t> local_shape(int rank) const;
  // Every rank's non-empty part, in rank order. Replicate: rank 0's copy stands for all
  // (a ShardedTensor's shards do not overlap).
  const std::vector<ShardMetadata>& shards_metadata() const { return shards_; }

  // This rank's part of a whole value of global_shape() (a view when possible). No communication.
  at::Tensor local_of_full(const at::Tensor& full) const;
  // This rank's part (shaped local_shape(rank)) as a ShardedTensor over the group. No communication.
  ShardedTensor to_sharded_tensor(const at::Tensor& local, bool copy) const;
  // True when `st` holds exactly this layout's parts on a group of the same size.
  bool matches(const ShardedTensor& st) const;
  // This rank's part of `st` (of global_shape()): its matching local shard, or, when `st` is
  // laid out another way, its full_tensor() (collective over st's group) cut by this layout.
  at::Tensor local_from(const ShardedTensor& st) const;

 private:
  std::vector<int64_t> global_shape_;
  std::vector<Placement> placements_;
  ProcessGroup group_;
  int64_t extent_ = 1;  // the sharded dim's size (1 for a 0-dim tensor)
  int64_t chunk_ = 1;
  std::vector<ShardMetadata> shards_;
  std::vector<ShardMetadata> blocks_;  // every rank's, when given as blocks
};

}  // namespace fsdpp
