// ZeroRedundancyOptimizer: the optimizer-independent part (partitioning, parameter sync,
// state consolidation and loading).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/collectives.h>
#include <fsdpp/zero_redundancy_optimizer.h>

#include "common/shape_string.h"
#include "compat/optimizer_state_key.h"

namespace fsdpp {
using detail::shape_string;

namespace {

using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamGroup;
using torch::optim::OptimizerParamState;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

// Checks one parameter for ZeRO's requirements; `first` is the parameter that fixes the dtype.
void check_param(const at::Tensor& p, const std::string& name, const at::Tensor* first, const std::string& first_name) {
  if (!p.defined()) throw Error("ZeroRedundancyOptimizer: " + name + " is an undefined tensor");
  if (p.layout() != at::kStrided)
    throw Error("ZeroRedundancyOptimizer only supports dense parameters of one type: " + name + " has layout " +
                c10::str(p.layout()) + " (sparse parameters are not supported)");
  if (!p.is_leaf()) throw Error("ZeroRedundancyOptimizer: " + name + " is not a leaf tensor (can't optimize a non-leaf tensor)");
  if (first && p.scalar_type() != first->scalar_type())
    throw Error("ZeroRedundancyOptimizer only supports using the same dense type for all parameters: " + first_name +
                " is " + c10::toString(first->scalar_type()) + ", " + name + " is " + c10::toString(p.scalar_type()));
}

class ZeroJoinHook : public JoinHook {
 public:
  explicit ZeroJoinHook(ZeroRedundancyOptimizerBase& zero) : zero_(zero) {}
  // A joined rank takes the step the others take: it updates its own partition with the
  // gradients it has and broadcasts it, matching the others' broadcasts.
  void main_hook() override { zero_.step(); }

 private:
  ZeroRedundancyOptimizerBase& zero_;
};

}  // namespace

ZeroRedundancyOptimizerBase::ZeroRedundancyOptimizerBase(std::vector<OptimizerParamGroup> param_groups,
                                                         std::unique_ptr<OptimizerOptions> defaults,
                                                         const ProcessGroup& group, bool parameters_as_bucket_view)
    : torch::optim::Optimizer(std::move(param_groups), std::move(defaults)),
      group_(group.defined() ? group : default_group()),
      bucket_view_(parameters_as_bucket_view) {
  if (!group_.is_member())
    throw Error("ZeroRedundancyOptimizer: this process is not a member of process group " + group_.name());
  rank_ = group_.rank();
  world_size_ = group_.size();
}

ZeroRedundancyOptimizerBase::~ZeroRedundancyOptimizerBase() = default;

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizerBase::checked(
    std::vector<OptimizerParamGroup> groups, const std::function<bool(const OptimizerOptions&)>& options_ok,
    const std::string& options_name) {
  const at::Tensor* first = nullptr;
  std::string first_name;
  int64_t index = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].has_options() && !options_ok(groups[g].options()))
      throw Error("ZeroRedundancyOptimizer: parameter group " + std::to_string(g) + " has options of type " +
                  detail::demangled(typeid(groups[g].options())) + ", expected " + options_name);
    for (const auto& p : groups[g].params()) {
      const std::string name = "parameter " + std::to_string(index++) + " (group " + std::to_string(g) + ")";
      check_param(p, name, first, first_name);
      if (!first) {
        first = &p;
        first_name = name;
      }
    }
  }
  if (index == 0) throw Error("ZeroRedundancyOptimizer did not receive any parameters");
  return groups;
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

// The wrapped optimizer over this rank's partition, one group per param group.
void ZeroRedundancyOptimizerBase::build_local_optimizer() {
  std::vector<OptimizerParamGroup> local_groups;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    std::vector<torch::Tensor> local;
    for (int64_t i : rank_params_[rank_])
      if (group_of_[i] == g) local.push_back(all_params_[i]);
    local_groups.emplace_back(std::move(local), param_groups_[g].options().clone());
  }
  local_ = make_local_optimizer(std::move(local_groups));
}

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

// Starts async broadcasts of the given parameters from `src`; a non-contiguous parameter
// travels through a contiguous copy that the caller copies back after waiting.
void ZeroRedundancyOptimizerBase::broadcast_params(const std::vector<int64_t>& indices, int src,
                                                   const ProcessGroup& group, std::vector<Work>& works,
                                                   std::vector<std::pair<torch::Tensor, torch::Tensor>>& copy_back) {
  for (int64_t i : indices) {
    torch::Tensor p = all_params_[i].detach();
    if (p.numel() == 0) continue;
    if (p.is_contiguous()) {
      works.push_back(broadcast(p, src, group, /*async_op=*/true));
    } else {
      torch::Tensor staging = p.contiguous();
      works.push_back(broadcast(staging, src, group, /*async_op=*/true));
      copy_back.emplace_back(p, staging);
    }
  }
}

void ZeroRedundancyOptimizerBase::sync_params() {
  if (world_size_ == 1) return;
  torch::NoGradGuard no_grad;
  std::vector<Work> works;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back;
  for (int r = 0; r < world_size_; ++r) {
    const int src = group_.global_rank(r);
    if (bucket_view_) {
      if (buckets_[r].numel() > 0) works.push_back(broadcast(buckets_[r], src, group_, /*async_op=*/true));
      continue;
    }
    broadcast_params(rank_params_[r], src, group_, works, copy_back);
  }
  for (auto& w : works) w.wait();
  for (auto& [p, staging] : copy_back) p.copy_(staging);
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
  // Options set on this optimizer's groups (an LR scheduler, load_state_dict) reach the
  // wrapped optimizer.
  auto& local_groups = local_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) assign_options(local_groups[g], param_groups_[g].options());
}

void ZeroRedundancyOptimizerBase::after_step() {
  sync_params();
  // Options the wrapped optimizer changed during its step show through param_groups().
  auto& local_groups = local_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) assign_options(param_groups_[g], local_groups[g].options());
  ++steps_;
  if (consolidated_) {
    consolidated_.reset();
    consolidated_stale_ = "step() ran after consolidate_state_dict()";
  }
}

void ZeroRedundancyOptimizerBase::zero_grad(bool set_to_none) {
  for (auto& group : param_groups_)
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        p.mutable_grad().reset();
      } else {
        p.mutable_grad().detach_();
        p.mutable_grad().zero_();
      }
    }
}

void ZeroRedundancyOptimizerBase::add_param_group(const OptimizerParamGroup& param_group) {
  if (overlap_with_ddp())
    throw Error("ZeroRedundancyOptimizer::add_param_group is not supported with overlap_with_ddp");
  const size_t g = param_groups_.size();
  if (param_group.has_options() && !options_compatible(param_group.options()))
    throw Error("ZeroRedundancyOptimizer::add_param_group: the group has options of type " +
                detail::demangled(typeid(param_group.options())) + ", expected " + options_type_name());
  const auto& params = param_group.params();
  for (size_t i = 0; i < params.size(); ++i)
    check_param(params[i], "parameter " + std::to_string(all_params_.size() + i) + " (group " + std::to_string(g) + ")",
                &all_params_.front(), "parameter 0");
  check_no_duplicates(params);

  torch::optim::Optimizer::add_param_group(param_group);
  partition_group(g);
  std::vector<torch::Tensor> local;
  for (int64_t i : rank_params_[rank_])
    if (group_of_[i] == g) local.push_back(all_params_[i]);
  local_->add_param_group(OptimizerParamGroup(std::move(local), param_groups_[g].options().clone()));
  if (bucket_view_) build_buckets();
  if (consolidated_) {
    consolidated_.reset();
    consolidated_stale_ = "add_param_group() ran after consolidate_state_dict()";
  }
}

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
    auto& local_groups = local_->param_groups();
    for (size_t g = 0; g < param_groups_.size(); ++g) assign_options(local_groups[g], param_groups_[g].options());
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
    for (size_t g = 0; g < param_groups_.size(); ++g) assign_options(param_groups_[g], local_groups[g].options());
  }
  if (world_size_ > 1) {
    torch::NoGradGuard no_grad;
    const int src = group.global_rank(owner);
    std::vector<Work> works;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back;
    broadcast_params(indices, src, group, works, copy_back);
    for (auto& w : works) w.wait();
    for (auto& [p, staging] : copy_back) p.copy_(staging);
  }
  if (b + 1 == bucket_params_.size()) ++steps_;
  if (consolidated_) {
    consolidated_.reset();
    consolidated_stale_ = "a DDP-overlapped step ran after consolidate_state_dict()";
  }
}

namespace {

// Each rank's bytes to group rank `to`, in rank order there (empty elsewhere): sizes by
// all_reduce, then one all_to_all in which only `to` receives.
std::vector<std::string> gather_bytes(const std::string& mine, int to, int rank, int n, const ProcessGroup& group) {
  if (n == 1) return {mine};
  at::Tensor sizes = at::zeros({n}, at::kLong);
  sizes[rank] = static_cast<int64_t>(mine.size());
  all_reduce(sizes, ReduceOp::SUM, group);
  std::vector<int64_t> in_splits(n, 0), out_splits(n, 0);
  in_splits[to] = static_cast<int64_t>(mine.size());
  int64_t total = 0;
  if (rank == to)
    for (int r = 0; r < n; ++r) total += out_splits[r] = sizes[r].item<int64_t>();
  at::Tensor input = at::empty({static_cast<int64_t>(mine.size())}, at::kByte);
  std::memcpy(input.data_ptr(), mine.data(), mine.size());
  at::Tensor output = at::empty({total}, at::kByte);
  all_to_all_single(output, input, out_splits, in_splits, group);
  std::vector<std::string> all;
  if (rank != to) return all;
  const char* data = static_cast<const char*>(output.data_ptr());
  int64_t offset = 0;
  for (int r = 0; r < n; ++r) {
    all.emplace_back(data + offset, out_splits[r]);
    offset += out_splits[r];
  }
  return all;
}

}  // namespace

void ZeroRedundancyOptimizerBase::consolidate_state_dict(int to) {
  if (to < 0 || to >= world_size_)
    throw Error("consolidate_state_dict: to=" + std::to_string(to) + " is not a rank of process group " + group_.name() +
                " (size " + std::to_string(world_size_) + ")");
  // This rank's state, keyed by parameter index.
  OutputArchive archive;
  OutputArchive state_archive(archive.compilation_unit());
  for (int64_t i : rank_params_[rank_]) {
    auto it = local_->state().find(compat::optimizer_state_key(all_params_[i]));
    if (it == local_->state().end()) continue;
    OutputArchive entry(archive.compilation_unit());
    it->second->serialize(entry);
    state_archive.write(std::to_string(i), entry);
  }
  archive.write("state", state_archive);
  std::ostringstream out;
  archive.save_to(out);

  std::vector<std::string> all = gather_bytes(out.str(), to, rank_, world_size_, group_);
  consolidated_.reset();
  consolidated_stale_.clear();
  if (rank_ != to) return;

  auto sd = std::make_unique<OptimizerStateDict>();
  int64_t index = 0;
  for (const auto& group : param_groups_) {
    OptimizerStateDict::ParamGroup g;
    g.options = group.options().clone();
    for (size_t j = 0; j < group.params().size(); ++j) g.params.push_back(index++);
    sd->param_groups.push_back(std::move(g));
  }
  for (int r = 0; r < world_size_; ++r) {
    InputArchive in;
    std::istringstream stream(all[r]);
    in.load_from(stream);
    InputArchive states;
    in.read("state", states);
    for (const std::string& key : states.keys()) {
      InputArchive entry;
      states.read(key, entry);
      auto st = new_param_state();
      st->serialize(entry);
      sd->state[std::stoll(key)] = std::move(st);
    }
  }
  consolidated_ = std::move(sd);
}

OptimizerStateDict ZeroRedundancyOptimizerBase::state_dict() const {
  if (!consolidated_) {
    const std::string who = "rank " + std::to_string(rank_) + " of process group " + group_.name();
    if (!consolidated_stale_.empty())
      throw Error("state_dict(): the state consolidated on " + who + " is stale (" + consolidated_stale_ +
                  "); call consolidate_state_dict(to) on all ranks again");
    throw Error("state_dict(): " + who +
                " holds no consolidated optimizer state; call consolidate_state_dict(to) on all ranks first, "
                "then state_dict() on rank `to`");
  }
  return *consolidated_;
}

void ZeroRedundancyOptimizerBase::load_state_dict(const OptimizerStateDict& sd) {
  const std::string ctx = "load_state_dict: ";
  if (sd.param_groups.size() != param_groups_.size())
    throw Error(ctx + "the state dict has " + std::to_string(sd.param_groups.size()) +
                " parameter groups, this optimizer has " + std::to_string(param_groups_.size()));
  // State-dict parameter index -> this optimizer's parameter index (by position, as libtorch).
  std::unordered_map<int64_t, int64_t> index_of;
  int64_t ours = 0;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& sg = sd.param_groups[g];
    if (sg.params.size() != param_groups_[g].params().size())
      throw Error(ctx + "parameter group " + std::to_string(g) + " has " + std::to_string(sg.params.size()) +
                  " parameters in the state dict, " + std::to_string(param_groups_[g].params().size()) +
                  " in this optimizer");
    if (!sg.options) throw Error(ctx + "parameter group " + std::to_string(g) + " of the state dict has no options");
    if (!options_compatible(*sg.options))
      throw Error(ctx + "parameter group " + std::to_string(g) + " has options of type " +
                  detail::demangled(typeid(*sg.options)) + ", this optimizer uses " + options_type_name());
    for (int64_t key : sg.params)
      if (!index_of.emplace(key, ours++).second)
        throw Error(ctx + "the state dict lists parameter " + std::to_string(key) + " twice");
  }

  // Validate every entry (on every rank, so all ranks agree on errors), keep this rank's.
  std::remove_reference_t<decltype(local_->state())> local_state;
  for (const auto& [key, st] : sd.state) {
    auto it = index_of.find(key);
    if (it == index_of.end())
      throw Error(ctx + "the state dict has state for parameter " + std::to_string(key) +
                  ", which none of its parameter groups lists");
    const int64_t i = it->second;
    const torch::Tensor& p = all_params_[i];
    const std::string name = "parameter " + std::to_string(i) + " (group " + std::to_string(group_of_[i]) + ", shape " +
                             shape_string(p.sizes()) + ")";
    if (!st) throw Error(ctx + "the state of " + name + " is null");
    if (!state_compatible(*st))
      throw Error(ctx + "the state of " + name + " is a " + detail::demangled(typeid(*st)) + ", this optimizer keeps " +
                  detail::demangled(typeid(*new_param_state())));
    // Round trip through an archive: lists the state's tensors and moves them to the
    // parameter's device.
    std::unique_ptr<OptimizerParamState> fresh = new_param_state();
    try {
      OutputArchive out;
      st->serialize(out);
      std::ostringstream bytes;
      out.save_to(bytes);
      InputArchive in;
      std::istringstream stream(bytes.str());
      in.load_from(stream, p.device());
      for (const std::string& field : in.keys()) {
        c10::IValue value;
        if (!in.try_read(field, value) || !value.isTensor()) continue;
        const at::Tensor t = value.toTensor();
        if (t.dim() > 0 && t.sizes() != p.sizes())
          throw Error(ctx + "the state '" + field + "' of " + name + " has shape " + shape_string(t.sizes()) +
                      ", not the parameter's");
      }
      fresh->serialize(in);
    } catch (const c10::Error& e) {
      throw Error(ctx + "cannot read the state of " + name + ": " + e.what_without_backtrace());
    }
    if (owner_[i] == rank_) local_state[compat::optimizer_state_key(p)] = std::move(fresh);
  }

  // Commit.
  local_->state() = std::move(local_state);
  auto& local_groups = local_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    assign_options(param_groups_[g], *sd.param_groups[g].options);
    assign_options(local_groups[g], *sd.param_groups[g].options);
  }
  if (consolidated_) {
    consolidated_.reset();
    consolidated_stale_ = "load_state_dict() ran after consolidate_state_dict()";
  }
}

OptimizerStateDict ZeroRedundancyOptimizerBase::state_dict_from_bytes(const std::string& bytes) const {
  return OptimizerStateDict::from_bytes(bytes, defaults(), [this] { return new_param_state(); });
}

void ZeroRedundancyOptimizerBase::save(OutputArchive& archive) const { state_dict().save(archive); }

void ZeroRedundancyOptimizerBase::load(InputArchive& archive) {
  load_state_dict(OptimizerStateDict::load(archive, defaults(), [this] { return new_param_state(); }));
}

std::unique_ptr<JoinHook> ZeroRedundancyOptimizerBase::join_hook() { return std::make_unique<ZeroJoinHook>(*this); }

c10::Device ZeroRedundancyOptimizerBase::join_device() const { return all_params_.front().device(); }

}  // namespace fsdpp
