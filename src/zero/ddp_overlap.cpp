// ZeroRedundancyOptimizer overlapped with DDP (PyTorch's overlap_with_ddp=True): partitioned by
// DDP bucket (whole buckets, or runs of a bucket with shard_buckets), each bucket stepped by
// its owners and broadcast as soon as its gradients are in.
// The hooks that call this live in ddp_zero_hook.cpp.
#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/zero_redundancy_optimizer.h>

namespace fsdpp {
namespace {

struct Run {
  int owner;
  size_t begin;  // the run's first position in its bucket
};

// The rank with the fewest elements among those not `taken`; when every rank is taken, the
// rank with the fewest (PyTorch raises there; a rank may as well own two runs of a bucket).
int least_loaded(const std::vector<int64_t>& size_per_rank, const std::vector<char>& taken) {
  int best = -1;
  for (int r = 0; r < static_cast<int>(size_per_rank.size()); ++r)
    if (!taken[r] && (best < 0 || size_per_rank[r] < size_per_rank[best])) best = r;
  if (best >= 0) return best;
  return static_cast<int>(std::min_element(size_per_rank.begin(), size_per_rank.end()) - size_per_rank.begin());
}

// Who owns which run of each bucket, `numels` giving each bucket's parameter sizes in order:
// PyTorch's ZeroRedundancyOptimizer._bucket_assignments_per_rank, so the same model is
// partitioned the same way in both.
std::vector<std::vector<Run>> assign_runs(const std::vector<std::vector<int64_t>>& numels, int world_size,
                                          bool shard_buckets) {
  std::vector<std::vector<Run>> runs(numels.size());
  if (!shard_buckets) {
    for (size_t b = 0; b < numels.size(); ++b) runs[b] = {{static_cast<int>(b % static_cast<size_t>(world_size)), 0}};
    return runs;
  }
  std::vector<int64_t> bucket_size(numels.size(), 0);
  for (size_t b = 0; b < numels.size(); ++b) bucket_size[b] = std::accumulate(numels[b].begin(), numels[b].end(), int64_t{0});
  const double threshold =
      static_cast<double>(std::accumulate(bucket_size.begin(), bucket_size.end(), int64_t{0})) / world_size;
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bucket_size[a] < bucket_size[b]; });
  std::vector<int64_t> size_per_rank(world_size, 0);
  for (size_t b : order) {
    std::vector<char> taken(world_size, 0);
    auto close_run = [&](size_t begin, int64_t size) {
      const int r = least_loaded(size_per_rank, taken);
      runs[b].push_back({r, begin});
      taken[r] = 1;
      size_per_rank[r] += size;
    };
    size_t begin = 0;
    int64_t size = 0;
    for (size_t j = 0; j < numels[b].size(); ++j) {
      if (static_cast<double>(size + numels[b][j]) >= threshold && j > begin) {
        close_run(begin, size);
        begin = j;
        size = 0;
      }
      size += numels[b][j];
    }
    close_run(begin, size);
  }
  return runs;
}

}  // namespace

void ZeroRedundancyOptimizerBase::partition_by_buckets(const std::vector<std::vector<torch::Tensor>>& buckets,
                                                       bool shard_buckets) {
  const std::string ctx = "ZeroRedundancyOptimizer::partition_by_buckets: ";
  if (overlap_with_ddp()) throw Error(ctx + "the optimizer is already partitioned by bucket");
  if (bucket_view_) throw Error(ctx + "not supported with parameters_as_bucket_view");
  if (steps_ > 0 || !local_->state().empty()) throw Error(ctx + "must be called before the first step");
  std::unordered_map<const void*, int64_t> index_of;
  for (size_t i = 0; i < all_params_.size(); ++i) index_of.emplace(all_params_[i].unsafeGetTensorImpl(), i);
  std::vector<std::vector<int64_t>> bucket_params(buckets.size()), numels(buckets.size());
  std::vector<char> seen(all_params_.size(), 0);
  for (size_t b = 0; b < buckets.size(); ++b)
    for (const auto& p : buckets[b]) {
      auto it = index_of.find(p.unsafeGetTensorImpl());
      if (it == index_of.end())
        throw Error(ctx + "bucket " + std::to_string(b) + " holds a tensor that is not a parameter of this optimizer");
      if (seen[it->second])
        throw Error(ctx + "parameter " + std::to_string(it->second) + " appears in more than one bucket (or twice)");
      seen[it->second] = 1;
      bucket_params[b].push_back(it->second);
      numels[b].push_back(p.numel());
    }
  for (size_t i = 0; i < seen.size(); ++i)
    if (!seen[i])
      throw Error(ctx + "parameter " + std::to_string(i) + " of the optimizer is in no bucket (every parameter must be in a DDP bucket)");
  const auto runs = assign_runs(numels, world_size_, shard_buckets);
  std::vector<int> owner(all_params_.size(), -1);
  bucket_runs_.assign(buckets.size(), {});
  for (size_t b = 0; b < buckets.size(); ++b)
    for (size_t k = 0; k < runs[b].size(); ++k) {
      const size_t end = k + 1 < runs[b].size() ? runs[b][k + 1].begin : bucket_params[b].size();
      for (size_t j = runs[b][k].begin; j < end; ++j) owner[bucket_params[b][j]] = runs[b][k].owner;
      bucket_runs_[b].push_back({runs[b][k].owner, runs[b][k].begin});
    }
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
  if (bucket_runs_.empty()) bucket_runs_.push_back({{0, 0}});
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
  // The bucket's runs: [begin, end) positions in `indices`, and who owns them.
  const auto& runs = bucket_runs_[b];
  auto run_end = [&](size_t k) { return k + 1 < runs.size() ? runs[k + 1].begin : indices.size(); };
  std::vector<size_t> mine;  // positions of this rank's parameters in the bucket
  for (size_t k = 0; k < runs.size(); ++k)
    if (runs[k].owner == rank_)
      for (size_t j = runs[k].begin; j < run_end(k); ++j) mine.push_back(j);
  if (!mine.empty()) {
    push_options();
    // The wrapped optimizer skips parameters without a gradient: show it this rank's part of
    // the bucket only.
    std::vector<std::pair<torch::Tensor, torch::Tensor>> saved;  // (parameter, its .grad)
    std::unordered_set<int64_t> stepped;
    for (size_t j : mine) stepped.insert(indices[j]);
    for (int64_t i : rank_params_[rank_]) {
      torch::Tensor& p = all_params_[i];
      saved.emplace_back(p, p.grad());
      if (!stepped.count(i)) p.mutable_grad().reset();
    }
    if (!gradients.empty())
      for (size_t j : mine) {
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
    PendingBroadcasts pending;
    for (size_t k = 0; k < runs.size(); ++k) {
      const std::vector<int64_t> run(indices.begin() + static_cast<std::ptrdiff_t>(runs[k].begin),
                                     indices.begin() + static_cast<std::ptrdiff_t>(run_end(k)));
      if (!run.empty()) broadcast_params(run, group.global_rank(runs[k].owner), group, pending);
    }
    pending.wait();
  }
  if (b + 1 == bucket_params_.size()) ++steps_;
  invalidate_consolidated("a DDP-overlapped step ran after consolidate_state_dict()");
}

}  // namespace fsdpp
