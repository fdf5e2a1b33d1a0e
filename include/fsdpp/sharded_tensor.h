#pragma once
// fsdpp::ShardedTensor (PyTorch's torch.distributed._shard.sharded_tensor.ShardedTensor): a
// tensor of a global size split into rectangular shards spread over a process group. Each rank
// holds its own shards (local_shards(): tensor + N-d offsets) and knows every rank's shard
// metadata (shards_metadata()), so full_tensor() and resharding need no extra exchange.
//
//   // rank r of 2 holds rows [2r, 2r + 2) of a 4x3 tensor:
//   auto st = fsdpp::ShardedTensor::from_local_shards(
//       {fsdpp::Shard::from_tensor_and_offsets(rows, {2 * r, 0}, r)}, {4, 3}, group);
//   at::Tensor whole = st.full_tensor();   // collective over `group`
//
// What a reader such as the distributed checkpoint needs per entry: size() (global shape),
// dtype(), and for each local shard its tensor and metadata.shard_offsets.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <fsdpp/process_group.h>

namespace fsdpp {

// Where one shard lives in the global tensor and which group rank holds it.
struct ShardMetadata {
  std::vector<int64_t> shard_offsets;
  std::vector<int64_t> shard_sizes;
  int placement = 0;  // group rank

  int64_t numel() const;
  bool operator==(const ShardMetadata& o) const {
    return shard_offsets == o.shard_offsets && shard_sizes == o.shard_sizes && placement == o.placement;
  }
};

// A local shard: its data and its metadata (shard_sizes equal tensor.sizes()).
struct Shard {
  at::Tensor tensor;
  ShardMetadata metadata;

  static Shard from_tensor_and_offsets(at::Tensor tensor, std::vector<int64_t> offsets, int rank);
};

class ShardedTensor {
 public:
  ShardedTensor() = default;

  // Collective over `group` (empty: the default group): exchanges the ranks' shard metadata
  // and checks that all ranks agree on the global size and dtype, that every shard lies inside
  // the global size with its tensor's shape and dtype, and that the shards neither overlap nor
  // leave a gap. Throws fsdpp::Error naming the rank and shard otherwise. A rank may hold no
  // shards. PyTorch's init_from_local_shards.
  static ShardedTensor from_local_shards(std::vector<Shard> local_shards, std::vector<int64_t> global_size,
                                         ProcessGroup group = {});

  // No communication: the caller knows every rank's shard metadata (the same on every rank;
  // `all_shards` lists them, this rank's in the order of `local_shards`). Checks the local
  // shards against it.
  static ShardedTensor from_local_shards_and_global_metadata(std::vector<Shard> local_shards,
                                                             std::vector<int64_t> global_size, at::ScalarType dtype,
                                                             std::vector<ShardMetadata> all_shards,
                                                             ProcessGroup group = {});

  bool defined() const { return defined_; }
  const std::vector<int64_t>& size() const { return size_; }
  int64_t dim() const { return static_cast<int64_t>(size_.size()); }
  int64_t numel() const;
  at::ScalarType dtype() const { return dtype_; }
  const std::vector<Shard>& local_shards() const { return local_shards_; }
  // Every rank's shards, local ones included.
  const std::vector<ShardMetadata>& shards_metadata() const { return shards_metadata_; }
  const ProcessGroup& process_group() const { return group_; }
  // True when the shards are exactly `shards` (in any order) over a group of `group_size` ranks.
  bool has_shards(const std::vector<ShardMetadata>& shards, int group_size) const;
  // This rank's shard with metadata `m`; throws naming the shard when this rank holds none such.
  const at::Tensor& local_shard(const ShardMetadata& m) const;

  // The whole tensor on every rank (collective over process_group(): one all-gather of each
  // rank's shards, padded to the largest rank's).
  at::Tensor full_tensor() const;

  // The same sharding with every local shard's tensor moved to the CPU (a copy).
  ShardedTensor cpu() const;

 private:
  bool defined_ = false;
  std::vector<int64_t> size_;
  at::ScalarType dtype_ = at::kFloat;
  std::vector<Shard> local_shards_;
  std::vector<ShardMetadata> shards_metadata_;
  ProcessGroup group_;
};

// PyTorch's name for ShardedTensor::from_local_shards.
inline ShardedTensor init_from_local_shards(std::vector<Shard> local_shards, std::vector<int64_t> global_size,
                                            ProcessGroup group = {}) {
  return ShardedTensor::from_local_shards(std::move(local_shards), std::move(global_size), std::move(group));
}

}  // namespace fsdpp
