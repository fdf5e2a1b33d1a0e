#include <fsdpp/tensor_layout.h>

#include <algorithm>

#include <ATen/ATen.h>

#include <fsdpp/error.h>

#include "common/shape_string.h"
#include "tensor/local_shard.h"

namespace fsdpp {
using detail::local_shard_size_and_offset;
using detail::shape_string;

TensorLayout::TensorLayout(std::vector<int64_t> global_shape, Placement placement, ProcessGroup group)
    : global_shape_(std::move(global_shape)), placements_{placement}, group_(std::move(group)) {
  const int n = group_.size();
  const auto ndim = static_cast<int64_t>(global_shape_.size());
  if (placement.is_shard()) {
    if (placement.dim() >= std::max<int64_t>(ndim, 1))
      throw Error("TensorLayout: " + placement.to_string() + " of a tensor of shape " + shape_string(global_shape_));
    extent_ = ndim == 0 ? 1 : global_shape_[placement.dim()];
    chunk_ = local_shard_size_and_offset(extent_, n, 0).padded;
  }
  for (int r = 0; r < n; ++r) {
    if (placement.is_replicate() && r > 0) break;
    if (placement.is_shard() && local_size(r) == 0) continue;
    ShardMetadata m;
    m.placement = r;
    if (ndim > 0) {  // a 0-dim tensor: one shard of shape [] on rank 0
      m.shard_offsets.assign(global_shape_.size(), 0);
      m.shard_sizes = global_shape_;
      if (placement.is_shard()) {
        m.shard_offsets[placement.dim()] = local_offset(r);
        m.shard_sizes[placement.dim()] = local_size(r);
      }
    }
    shards_.push_back(std::move(m));
  }
}

TensorLayout::TensorLayout(std::vector<int64_t> global_shape, std::vector<Placement> placements, ProcessGroup group,
                           std::vector<ShardMetadata> blocks)
    : global_shape_(std::move(global_shape)), placements_(std::move(placements)), group_(std::move(group)),
      blocks_(std::move(blocks)) {
  const auto where = [&](size_t r) { return "TensorLayout: rank " + std::to_string(r) + "'s block"; };
  if (static_cast<int>(blocks_.size()) != group_.size())
    throw Error("TensorLayout: " + std::to_string(blocks_.size()) + " blocks for a group of " +
                std::to_string(group_.size()) + " ranks");
  int64_t covered = 0;
  for (size_t r = 0; r < blocks_.size(); ++r) {
    const ShardMetadata& b = blocks_[r];
    if (b.placement != static_cast<int>(r) || b.shard_offsets.size() != global_shape_.size() ||
        b.shard_sizes.size() != global_shape_.size())
      throw Error(where(r) + " does not match rank " + std::to_string(r) + " and shape " + shape_string(global_shape_));
    for (size_t d = 0; d < global_shape_.size(); ++d)
      if (b.shard_offsets[d] < 0 || b.shard_sizes[d] < 0 || b.shard_offsets[d] + b.shard_sizes[d] > global_shape_[d])
        throw Error(where(r) + " at " + shape_string(b.shard_offsets) + " of shape " + shape_string(b.shard_sizes) +
                    " lies outside " + shape_string(global_shape_));
    if (b.numel() > 0) shards_.push_back(b);
    covered += b.numel();
  }
  // Blocks inside the tensor whose sizes add up to it tile it exactly when none overlap; the
  // builders cut disjoint blocks, so the sum is the check that catches a wrong cut.
  if (covered != numel())
    throw Error("TensorLayout: blocks of " + std::to_string(covered) + " elements for a tensor of shape " +
                shape_string(global_shape_));
}

int64_t TensorLayout::numel() const {
  int64_t n = 1;
  for (int64_t s : global_shape_) n *= s;
  return n;
}

int64_t TensorLayout::local_size(int rank) const {
  if (is_blocks()) throw Error("TensorLayout: local_size of a layout given as blocks; use local_shape");
  if (placements_.front().is_replicate()) return extent_;
  return local_shard_size_and_offset(extent_, group_.size(), rank).size;
}

int64_t TensorLayout::local_offset(int rank) const {
  if (is_blocks()) throw Error("TensorLayout: local_offset of a layout given as blocks; use blocks()");
  if (placements_.front().is_replicate()) return 0;
  return local_shard_size_and_offset(extent_, group_.size(), rank).offset;
}

std::vector<int64_t> TensorLayout::local_shape(int rank) const {
  if (is_blocks()) return blocks_.at(rank).shard_sizes;
  if (placements_.front().is_replicate()) return global_shape_;
  if (global_shape_.empty()) return {local_size(rank)};
  std::vector<int64_t> s = global_shape_;
  s[placements_.front().dim()] = local_size(rank);
  return s;
}

at::Tensor TensorLayout::local_of_full(const at::Tensor& full) const {
  if (full.sizes() != at::IntArrayRef(global_shape_))
    throw Error("TensorLayout: a whole value of shape " + shape_string(full.sizes()) + " for a tensor of shape " +
                shape_string(global_shape_));
  const int rank = group_.rank();
  if (is_blocks()) {
    at::Tensor part = full;
    const ShardMetadata& b = blocks_.at(rank);
    for (size_t d = 0; d < global_shape_.size(); ++d)
      part = part.narrow(static_cast<int64_t>(d), b.shard_offsets[d], b.shard_sizes[d]);
    return part;
  }
  if (placements_.front().is_replicate()) return full;
  if (global_shape_.empty()) return full.reshape({1}).narrow(0, local_offset(rank), local_size(rank));
  return full.narrow(placements_.front().dim(), local_offset(rank), local_size(rank));
}

ShardedTensor TensorLayout::to_sharded_tensor(const at::Tensor& local, bool copy) const {
  const int rank = group_.rank();
  std::vector<Shard> mine;
  for (const auto& m : shards_) {
    if (m.placement != rank) continue;
    at::Tensor t = local.detach().reshape(m.shard_sizes);
    mine.push_back({copy ? t.clone() : t, m});
  }
  return ShardedTensor::from_local_shards_and_global_metadata(std::move(mine), global_shape_, local.scalar_type(), shards_,
                                                              group_);
}

bool TensorLayout::matches(const ShardedTensor& st) const { return st.has_shards(shards_, group_.size()); }

at::Tensor TensorLayout::local_from(const ShardedTensor& st) const {
  const int rank = group_.rank();
  if (matches(st)) {
    for (const auto& m : shards_)
      if (m.placement == rank) return st.local_shard(m).reshape(local_shape(rank));
    return at::empty(local_shape(rank), at::TensorOptions().dtype(st.dtype()));
  }
  if (!st.process_group().is_member())
    throw Error("a ShardedTensor laid out differently from the model needs redistributing, but this rank is not a "
                "member of its process group " + st.process_group().name());
  return local_of_full(st.full_tensor());
}

}  // namespace fsdpp
