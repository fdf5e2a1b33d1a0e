#include "fsdp/unit_flat_layout.h"

#include <fsdpp/error.h>

namespace fsdpp::detail {

UnitFlatLayout::UnitFlatLayout(const std::vector<FSDPParam>& params, int world_size) : world_size_(world_size) {
  for (const auto& p : params) {
    shard_offsets_.push_back(shard_numel_);
    shard_numel_ += p.padded_chunk_numel();
  }
}

GatherLayout UnitFlatLayout::gather_layout(int64_t blocks_per_member) const {
  GatherLayout layout;
  layout.block_numel = shard_numel_;
  layout.blocks_per_member = blocks_per_member;
  layout.ranks = world_size_;
  for (size_t i = 0; i < shard_offsets_.size(); ++i) {
    const int64_t end = i + 1 < shard_offsets_.size() ? shard_offsets_[i + 1] : shard_numel_;
    layout.pieces.push_back({shard_offsets_[i], end - shard_offsets_[i], unsharded_offset(i)});
  }
  return layout;
}

at::Tensor UnitFlatLayout::post_forward_shard(const std::vector<FSDPParam>& params, int64_t first_rank,
                                              int64_t per_member, const at::TensorOptions& options) const {
  at::Tensor kept = at::empty({per_member * shard_numel_}, options);
  at::Tensor by_rank = kept.view({per_member, shard_numel_});
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t c = params[i].padded_chunk_numel();
    by_rank.narrow(1, shard_offset(i), c)
        .copy_(params[i].unsharded_region().view({world_size_, c}).narrow(0, first_rank, per_member));
  }
  return kept;
}

at::Tensor UnitFlatLayout::reduce_scatter_input(const std::vector<FSDPParam>& params, std::vector<at::Tensor>& grads,
                                                const at::TensorOptions& options) const {
  // No memset of the whole input: padding rows only reach padding outputs, which every rank
  // discards; a parameter without a gradient must still add zeros to the others' sum.
  at::Tensor input = at::empty({unsharded_numel()}, options);
  at::Tensor by_rank = input.view({world_size_, shard_numel_});
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!grads[i].defined()) {
      by_rank.narrow(1, shard_offset(i), p.padded_chunk_numel()).zero_();
      continue;
    }
    at::Tensor rows = grads[i].reshape({p.dim0(), p.row_numel()});
    for (int r = 0; r < world_size_; ++r) {
      const int64_t n = p.rows_of(r);
      if (n == 0) continue;
      by_rank[r].narrow(0, shard_offset(i), n * p.row_numel()).view({n, p.row_numel()}).copy_(rows.narrow(0, p.row_offset(r), n));
    }
    grads[i] = at::Tensor();
  }
  return input;
}

at::Tensor UnitFlatLayout::gradient_shard(const std::vector<FSDPParam>& params, const at::Tensor& output,
                                          size_t i) const {
  const auto& p = params[i];
  return output.narrow(0, shard_offset(i), p.local_rows() * p.row_numel()).view(p.sharded_size());
}

std::vector<ShardMetadata> UnitFlatLayout::local_flat_shards(const std::vector<FSDPParam>& params) const {
  std::vector<ShardMetadata> all;
  int64_t flat_offset = 0;
  for (const auto& p : params) {
    for (int r = 0; r < world_size_; ++r)
      if (p.rows_of(r) > 0)
        all.push_back({{flat_offset + p.row_offset(r) * p.row_numel()}, {p.rows_of(r) * p.row_numel()}, r});
    flat_offset += p.numel();
  }
  return all;
}

ShardedTensor UnitFlatLayout::local_flat_value(const std::vector<FSDPParam>& params, at::ScalarType dtype,
                                               const ProcessGroup& group) const {
  const int rank = group.rank();
  std::vector<ShardMetadata> all = local_flat_shards(params);
  std::vector<Shard> mine;
  size_t next = 0;
  int64_t total = 0;
  for (const auto& p : params) {
    total += p.numel();
    if (p.local_rows() == 0) continue;
    while (all[next].placement != rank) ++next;
    mine.push_back({p.sharded_view().detach().reshape({-1}).clone(), all[next++]});
  }
  return ShardedTensor::from_local_shards_and_global_metadata(std::move(mine), {total}, dtype, std::move(all), group);
}

std::vector<at::Tensor> UnitFlatLayout::local_rows_from_flat(const std::vector<FSDPParam>& params,
                                                             const ShardedTensor& flat, int rank,
                                                             const std::string& unit_name) const {
  std::vector<at::Tensor> out;
  int64_t flat_offset = 0;
  if (flat.has_shards(local_flat_shards(params), world_size_)) {
    for (const auto& p : params) {
      const int64_t rows = p.local_rows();
      out.push_back(rows == 0 ? at::empty(p.sharded_size(), at::TensorOptions().dtype(flat.dtype()))
                              : flat.local_shard({{flat_offset + p.row_offset(rank) * p.row_numel()}, {rows * p.row_numel()}, rank})
                                    .reshape(p.sharded_size()));
      flat_offset += p.numel();
    }
    return out;
  }
  // Sharded another way (another world size): the whole flat value once, then each parameter's rows.
  if (!flat.process_group().is_member())
    throw Error("FSDP unit " + unit_name + ": a flat parameter sharded differently from the model needs redistributing, "
                "but this rank is not a member of its process group " + flat.process_group().name());
  at::Tensor full = flat.full_tensor();
  for (const auto& p : params) {
    out.push_back(p.layout().local_of_full(full.narrow(0, flat_offset, p.numel()).view(p.unsharded_size())));
    flat_offset += p.numel();
  }
  return out;
}

}  // namespace fsdpp::detail
