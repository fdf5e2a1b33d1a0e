#include "fsdp/fsdp_collectives.h"

#include "comm/process_group_impl.h"

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

at::Tensor post_forward_shard(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat, int64_t first_rank,
                              int64_t per_member, const at::TensorOptions& options) {
  at::Tensor kept = at::empty({per_member * flat.shard_numel()}, options);
  at::Tensor by_rank = kept.view({per_member, flat.shard_numel()});
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t c = params[i].padded_chunk_numel();
    by_rank.narrow(1, flat.shard_offset(i), c)
        .copy_(params[i].unsharded_region().view({flat.world_size(), c}).narrow(0, first_rank, per_member));
  }
  return kept;
}

ProcessGroup post_forward_group(const ProcessGroup& group, int k) { return consecutive_subgroup(group, k); }

at::Tensor reduce_scatter_input(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat,
                                std::vector<at::Tensor>& grads, const at::TensorOptions& options) {
  // No memset of the whole input: padding rows only reach padding outputs, which every rank
  // discards; a parameter without a gradient must still add zeros to the others' sum.
  at::Tensor input = at::empty({flat.unsharded_numel()}, options);
  at::Tensor by_rank = input.view({flat.world_size(), flat.shard_numel()});
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!grads[i].defined()) {
      by_rank.narrow(1, flat.shard_offset(i), p.padded_chunk_numel()).zero_();
      continue;
    }
    at::Tensor rows = grads[i].reshape({p.dim0(), p.row_numel()});
    for (int r = 0; r < flat.world_size(); ++r) {
      const int64_t n = p.rows_of(r);
      if (n == 0) continue;
      by_rank[r].narrow(0, flat.shard_offset(i), n * p.row_numel()).view({n, p.row_numel()}).copy_(rows.narrow(0, p.row_offset(r), n));
    }
    grads[i] = at::Tensor();
  }
  return input;
}

at::Tensor gradient_shard(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat, const at::Tensor& output,
                          size_t i) {
  const auto& p = params[i];
  return output.narrow(0, flat.shard_offset(i), p.local_rows() * p.row_numel()).view(p.sharded_size());
}

}  // namespace fsdpp::detail
