#pragma once
// One original parameter under FSDP: its layout (Shard(0) over the unit's group, the one
// sharding rule), the padded storage of its rows, and the swaps of its data between the local
// shard (at rest) and a view into the unit's unsharded buffer (during compute).
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/tensor_layout.h>

namespace fsdpp::detail {

class FSDPParam {
 public:
  // `param` keeps its TensorImpl; its data is replaced by views FSDPParamGroup assigns.
  FSDPParam(std::string fqn, at::Tensor param, const ProcessGroup& group);

  const std::string& fqn() const { return fqn_; }
  const at::Tensor& param() const { return param_; }
  const TensorLayout& layout() const { return layout_; }
  const std::vector<int64_t>& unsharded_size() const { return layout_.global_shape(); }
  const std::vector<int64_t>& sharded_size() const { return sharded_size_; }
  int64_t numel() const { return numel_; }
  // Rows of dim 0 (1 for a 0-dim parameter), rows per rank's chunk, elements per row.
  int64_t dim0() const { return dim0_; }
  int64_t chunk_rows() const { return layout_.chunk_size(); }
  int64_t row_numel() const { return row_numel_; }
  // Elements of every rank's (padded) chunk, and this rank's real rows.
  int64_t padded_chunk_numel() const { return chunk_rows() * row_numel_; }
  int64_t local_rows() const { return layout_.local_size(rank_); }
  // Where rank's chunk starts in the padded rows of the unsharded buffer.
  int64_t row_offset(int rank) const { return rank * chunk_rows(); }
  int64_t rows_of(int rank) const { return layout_.local_size(rank); }

  // Binds the shard to `padded_chunk` (this rank's region of the unit's flat sharded buffer,
  // padded_chunk_numel() elements), copies this rank's rows of the current (full) value into
  // it and makes the parameter the shard.
  void init_sharded(const at::Tensor& padded_chunk);
  // Binds the unsharded view to `region` (N * padded_chunk_numel() elements of the unit's
  // unsharded buffer, in row order).
  void init_unsharded(const at::Tensor& region);
  // Before init_sharded, while the parameter is still full: copies it into the unsharded view.
  void copy_full_into_unsharded();

  // Copies this rank's rows of the unsharded view into the shard (summon_full_params with
  // writeback).
  void write_back_unsharded();

  // The parameter's data becomes the unsharded view; a shard-shaped `.grad` is set aside.
  void to_unsharded();
  // The parameter's data becomes the shard again; the set-aside `.grad` comes back.
  void to_sharded();
  bool is_sharded() const { return sharded_; }

  // If the user replaced the parameter's data while sharded (set_data with the same shape),
  // copies it into the shard and rebinds; throws on a different shape or dtype.
  void check_sharded_data();

  // After a cast of the module (module->to(dtype)) replaced the shard by a tensor of another
  // dtype: moves the current shard values into `padded_chunk` of the new buffer.
  void rebind_sharded(const at::Tensor& padded_chunk);
  bool dtype_changed() const { return sharded_ && param_.scalar_type() != sharded_view_.scalar_type(); }

  const at::Tensor& sharded_view() const { return sharded_view_; }
  const at::Tensor& padded_chunk() const { return padded_chunk_; }
  const at::Tensor& unsharded_region() const { return unsharded_region_; }

 private:
  std::string fqn_;
  at::Tensor param_;
  TensorLayout layout_;
  std::vector<int64_t> sharded_size_;
  int64_t numel_ = 0;
  int64_t dim0_ = 1;
  int64_t row_numel_ = 1;
  int rank_ = 0;
  bool sharded_ = false;
  at::Tensor padded_chunk_;      // this rank's padded chunk, flat
  at::Tensor sharded_view_;      // its first local_rows rows, shaped sharded_size
  at::Tensor unsharded_region_;  // all ranks' padded chunks, flat, in row order
  at::Tensor unsharded_view_;    // the first numel elements of it, shaped unsharded_size
  at::Tensor stashed_grad_;      // the shard-shaped .grad while unsharded
};

}  // namespace fsdpp::detail
