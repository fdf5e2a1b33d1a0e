// ZeroRedundancyOptimizer's wrapped optimizer: built over this rank's partition, kept in step
// with param_groups()' options, and followed by the broadcasts that hand each rank's updated
// partition to the others.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/collectives.h>
#include <fsdpp/zero_redundancy_optimizer.h>

namespace fsdpp {

using torch::optim::OptimizerParamGroup;

std::vector<torch::Tensor> ZeroRedundancyOptimizerBase::local_params(size_t g) const {
  std::vector<torch::Tensor> local;
  for (int64_t i : rank_params_[rank_])
    if (group_of_[i] == g) local.push_back(all_params_[i]);
  return local;
}

// The wrapped optimizer over this rank's partition, one group per param group.
void ZeroRedundancyOptimizerBase::build_local_optimizer() {
  std::vector<OptimizerParamGroup> local_groups;
  for (size_t g = 0; g < param_groups_.size(); ++g)
    local_groups.emplace_back(local_params(g), param_groups_[g].options().clone());
  local_ = make_local_optimizer(std::move(local_groups));
}

// Options set on this optimizer's groups (an LR scheduler, load_state_dict) reach the wrapped
// optimizer.
void ZeroRedundancyOptimizerBase::push_options() {
  auto& local_groups = local_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) assign_options(local_groups[g], param_groups_[g].options());
}

// Options the wrapped optimizer changed during its step show through param_groups().
void ZeroRedundancyOptimizerBase::pull_options() {
  auto& local_groups = local_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) assign_options(param_groups_[g], local_groups[g].options());
}

torch::Tensor ZeroRedundancyOptimizerBase::step(LossClosure closure) {
  if (overlap_with_ddp()) {
    if (closure)
      throw Error("ZeroRedundancyOptimizer::step: with overlap_with_ddp the DDP hook steps during backward; "
                  "step() is a no-op and takes no closure");
    return {};
  }
  before_step();
  torch::Tensor loss = local_->step(std::move(closure));
  after_step();
  return loss;
}

void ZeroRedundancyOptimizerBase::before_step() {
  if (overlap_with_ddp())
    throw Error("ZeroRedundancyOptimizer::step: with overlap_with_ddp the DDP hook steps during backward");
  Join::notify_join_context(*this);
  push_options();
}

void ZeroRedundancyOptimizerBase::after_step() {
  sync_params();
  pull_options();
  ++steps_;
  invalidate_consolidated("step() ran after consolidate_state_dict()");
}

// Starts async broadcasts of the given parameters from `src`; a non-contiguous parameter
// travels through a contiguous copy that wait() copies back.
void ZeroRedundancyOptimizerBase::broadcast_params(const std::vector<int64_t>& indices, int src,
                                                   const ProcessGroup& group, PendingBroadcasts& pending) {
  for (int64_t i : indices) {
    torch::Tensor p = all_params_[i].detach();
    if (p.numel() == 0) continue;
    if (p.is_contiguous()) {
      pending.works.push_back(broadcast(p, src, group, /*async_op=*/true));
    } else {
      torch::Tensor staging = p.contiguous();
      pending.works.push_back(broadcast(staging, src, group, /*async_op=*/true));
      pending.copy_back.emplace_back(p, staging);
    }
  }
}

void ZeroRedundancyOptimizerBase::PendingBroadcasts::wait() {
  for (auto& w : works) w.wait();
  for (auto& [p, staging] : copy_back) p.copy_(staging);
}

void ZeroRedundancyOptimizerBase::sync_params() {
  if (world_size_ == 1) return;
  torch::NoGradGuard no_grad;
  PendingBroadcasts pending;
  for (int r = 0; r < world_size_; ++r) {
    const int src = group_.global_rank(r);
    if (bucket_view_) {
      if (buckets_[r].numel() > 0) pending.works.push_back(broadcast(buckets_[r], src, group_, /*async_op=*/true));
      continue;
    }
    broadcast_params(rank_params_[r], src, group_, pending);
  }
  pending.wait();
}

}  // namespace fsdpp
