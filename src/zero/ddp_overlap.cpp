// ZeroRedundancyOptimizer overlapped with DDP (PyTorch's overlap_with_ddp=True): partitioned by
// DDP bucket, each bucket stepped on its owner and broadcast as soon as its gradients are in.
// The hooks that call this live in ddp_zero_hook.cpp.
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/zero_redundancy_optimizer.h>

namespace fsdpp {

void ZeroRedundancyOptimizerBase::partition_by_buckets(const std::vector<std::vector<torch::Tensor>>& buckets) {
  const std::string ctx = "ZeroRedundancyOptimizer::partition_by_buckets: ";
  if (overlap_with_ddp()) throw Error(ctx + "the optimizer is already partitioned by bucket");
  if (bucket_view_) throw Error(ctx + "not supported with parameters_as_bucket_view");
  if (steps_ > 0 || !local_->state().empty()) throw Error(ctx + "must be called before the first step");
  std::unordered_map<const void*, int64_t> index_of;
  for (size_t i = 0; i < all_params_.size(); ++i) index_of.emplace(all_params_[i].unsafeGetTensorImpl(), i);
  std::vector<std::vector<int64_t>> bucket_params(buckets.size());
  std::vector<int> owner(all_params_.size(), -1);
  for (size_t b = 0; b < buckets.size(); ++b)
    for (const auto& p : buckets[b]) {
      auto it = index_of.find(p.unsafeGetTensorImpl());
      if (it == index_of.end())
        throw Error(ctx + "bucket " + std::to_string(b) + " holds a tensor that is not a parameter of this optimizer");
      if (owner[it->second] != -1)
        throw Error(ctx + "parameter " + std::to_string(it->second) + " appears in more than one bucket (or twice)");
      owner[it->second] = bucket_owner(b);
      bucket_params[b].push_back(it->second);
    }
  for (size_t i = 0; i < owner.size(); ++i)
    if (owner[i] == -1)
      throw Error(ctx + "parameter " + std::to_string(i) + " of the optimizer is in no bucket (every parameter must be in a DDP bucket)");
  rank_params_.assign(world_size_, {});
  rank_sizes_.assign(world_size_, 0);
  for (const auto& indices : bucket_params)
    for (int64_t i : indices) {
      rank_params_[owner[i]].push_back(i);
      rank_sizes_[owner[i]] += all_params_[i].numel();
    }
  owner_ = std::move(owner);
  build_local_optimizer();
  bucket_params_ = std::move(bucket_params);
  if (bucket_params_.empty()) bucket_params_.emplace_back();  // keeps overlap_with_ddp() true
}

void ZeroRedundancyOptimizerBase::step_bucket(size_t b, const std::vector<torch::Tensor>& gradients,
                                              const ProcessGroup& group) {
  if (!overlap_with_ddp()) throw Error("ZeroRedundancyOptimizer::step_bucket: call partition_by_buckets first");
  if (b >= bucket_params_.size())
    throw Error("ZeroRedundancyOptimizer::step_bucket: bucket " + std::to_string(b) + " out of range (" +
                std::to_string(bucket_params_.size()) + " buckets)");
  const auto& indices = bucket_params_[b];
  if (!gradients.empty() && gradients.size() != indices.size())
    throw Error("ZeroRedundancyOptimizer::step_bucket: bucket " + std::to_string(b) + " has " +
                std::to_string(indices.size()) + " parameters, got " + std::to_string(gradients.size()) + " gradients");
  const int owner = bucket_owner(b);
  if (owner == rank_) {
    push_options();
    // The wrapped optimizer skips parameters without a gradient: show it the bucket's only.
    std::vector<std::pair<torch::Tensor, torch::Tensor>> saved;  // (parameter, its .grad)
    std::unordered_set<int64_t> in_bucket(indices.begin(), indices.end());
    for (int64_t i : rank_params_[rank_]) {
      torch::Tensor& p = all_params_[i];
      saved.emplace_back(p, p.grad());
      if (!in_bucket.count(i)) p.mutable_grad().reset();
    }
    if (!gradients.empty())
      for (size_t j = 0; j < indices.size(); ++j) {
        torch::Tensor& p = all_params_[indices[j]];
        if (gradients[j].defined())
          p.mutable_grad() = gradients[j].detach();
        else
          p.mutable_grad().reset();
      }
    auto restore = [&] {
      for (auto& [p, grad] : saved) p.mutable_grad() = grad;
    };
    try {
      local_->step();
    } catch (...) {
      restore();
      throw;
    }
    restore();
    pull_options();
  }
  if (world_size_ > 1) {
    torch::NoGradGuard no_grad;
    const int src = group.global_rank(owner);
    PendingBroadcasts pending;
    broadcast_params(indices, src, group, pending);
    pending.wait();
  }
  if (b + 1 == bucket_params_.size()) ++steps_;
  invalidate_consolidated("a DDP-overlapped step ran after consolidate_state_dict()");
}

}  // namespace fsdpp
