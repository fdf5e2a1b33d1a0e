// ZeroRedundancyOptimizer's partition: which rank owns which parameter (PyTorch's sorted-greedy
// algorithm), and with parameters_as_bucket_view the flat buffer each rank's partition lives in.
#include <algorithm>
#include <numeric>
#include <unordered_map>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/zero_redundancy_optimizer.h>

namespace fsdpp {

void ZeroRedundancyOptimizerBase::initialize() {
  rank_sizes_.assign(world_size_, 0);
  rank_params_.assign(world_size_, {});
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    check_no_duplicates(param_groups_[g].params());
    partition_group(g);
  }
  build_local_optimizer();
  if (bucket_view_) build_buckets();
}

void ZeroRedundancyOptimizerBase::check_no_duplicates(const std::vector<torch::Tensor>& params) const {
  std::unordered_map<const void*, size_t> seen;
  for (size_t i = 0; i < all_params_.size(); ++i) seen.emplace(all_params_[i].unsafeGetTensorImpl(), i);
  for (size_t i = 0; i < params.size(); ++i) {
    auto [it, inserted] = seen.emplace(params[i].unsafeGetTensorImpl(), all_params_.size() + i);
    if (!inserted)
      throw Error("ZeroRedundancyOptimizer: parameter " + std::to_string(all_params_.size() + i) +
                  " is the same tensor as parameter " + std::to_string(it->second) +
                  " (some parameters appear in more than one parameter group)");
  }
}

// PyTorch's sorted-greedy partition: the group's parameters by size, largest first (ties keep
// their order), each to the rank with the fewest elements so far (ties to the lowest rank).
// The per-rank totals carry over from the previous groups.
void ZeroRedundancyOptimizerBase::partition_group(size_t g) {
  const auto& params = param_groups_[g].params();
  const int64_t base = static_cast<int64_t>(all_params_.size());
  for (const auto& p : params) {
    all_params_.push_back(p);
    group_of_.push_back(g);
    owner_.push_back(-1);
  }
  std::vector<int64_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return params[a].numel() > params[b].numel(); });
  for (int64_t i : order) {
    const int r = static_cast<int>(std::min_element(rank_sizes_.begin(), rank_sizes_.end()) - rank_sizes_.begin());
    owner_[base + i] = r;
    rank_params_[r].push_back(base + i);
    rank_sizes_[r] += params[i].numel();
  }
}

// parameters_as_bucket_view: each rank's partition lives in one flat buffer, the parameters
// being views into it, so a rank's update travels as one broadcast.
void ZeroRedundancyOptimizerBase::build_buckets() {
  torch::NoGradGuard no_grad;
  const c10::Device device = all_params_.front().device();
  for (size_t i = 0; i < all_params_.size(); ++i)
    if (all_params_[i].device() != device)
      throw Error("ZeroRedundancyOptimizer: parameters_as_bucket_view needs all parameters on one device: parameter 0 is on " +
                  device.str() + ", parameter " + std::to_string(i) + " on " + all_params_[i].device().str());
  std::vector<torch::Tensor> buckets(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    int64_t total = 0;
    for (int64_t i : rank_params_[r]) total += all_params_[i].numel();
    buckets[r] = at::empty({total}, all_params_.front().options().requires_grad(false));
    int64_t offset = 0;
    for (int64_t i : rank_params_[r]) {
      torch::Tensor& p = all_params_[i];
      const int64_t n = p.numel();
      torch::Tensor view = buckets[r].narrow(0, offset, n).view(p.sizes());
      view.copy_(p.detach());
      p.set_data(view);
      offset += n;
    }
  }
  buckets_ = std::move(buckets);
}

}  // namespace fsdpp
