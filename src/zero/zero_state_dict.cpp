// ZeroRedundancyOptimizer's state dicts: consolidating every partition's state on one rank, and
// loading a whole optimizer's state into this rank's partition.
#include <cstring>
#include <sstream>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <fsdpp/collectives.h>
#include <fsdpp/zero_redundancy_optimizer.h>

#include "common/shape_string.h"
#include "compat/optimizer_state_key.h"
#include "optim/optimizer_state.h"

namespace fsdpp {
using detail::shape_string;

namespace {

using torch::optim::OptimizerParamState;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

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
    const OptimizerParamState* st = detail::find_param_state(*local_, all_params_[i]);
    if (!st) continue;
    OutputArchive entry(archive.compilation_unit());
    st->serialize(entry);
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
    for (size_t j = 0; j < group.params().size(); ++j) g.params.push_back(std::to_string(index++));
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
      sd->state[key] = detail::param_state_entries(*st);
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
  // State-dict parameter key -> this optimizer's parameter index (by position, as libtorch).
  std::unordered_map<std::string, int64_t> index_of;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  int64_t ours = 0;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& sg = sd.param_groups[g];
    const std::string group = "parameter group " + std::to_string(g);
    if (sg.params.size() != param_groups_[g].params().size())
      throw Error(ctx + group + " has " + std::to_string(sg.params.size()) + " parameters in the state dict, " +
                  std::to_string(param_groups_[g].params().size()) + " in this optimizer");
    if (sg.options) {
      if (!options_compatible(*sg.options))
        throw Error(ctx + group + " has options of type " + detail::demangled(typeid(*sg.options)) +
                    ", this optimizer uses " + options_type_name());
      options.push_back(sg.options->clone());
    } else if (!sg.options_bytes.empty()) {
      // Read with torch::load: the options are libtorch's bytes, parsed as this optimizer's type.
      try {
        options.push_back(detail::options_from_bytes(defaults(), sg.options_bytes));
      } catch (const c10::Error& e) {
        throw Error(ctx + "the options of " + group + " do not read as " + options_type_name() + ": " +
                    e.what_without_backtrace());
      }
    } else {
      throw Error(ctx + group + " of the state dict has no options");
    }
    for (const std::string& key : sg.params)
      if (!index_of.emplace(key, ours++).second)
        throw Error(ctx + "the state dict lists parameter " + key + " twice");
  }

  // Validate every entry (on every rank, so all ranks agree on errors), keep this rank's.
  std::remove_reference_t<decltype(local_->state())> local_state;
  for (const auto& [key, entries] : sd.state) {
    auto it = index_of.find(key);
    if (it == index_of.end())
      throw Error(ctx + "the state dict has state for parameter " + key + ", which none of its parameter groups lists");
    const int64_t i = it->second;
    const torch::Tensor& p = all_params_[i];
    const std::string name = "parameter " + std::to_string(i) + " (group " + std::to_string(group_of_[i]) + ", shape " +
                             shape_string(p.sizes()) + ")";
    for (const auto& [field, value] : entries)
      if (!value.is_tensor())
        throw Error(ctx + "the state '" + field + "' of " + name + " is a ShardedTensor (a sharded state dict " +
                    "loads with set_optimizer_state_dict)");
    std::unique_ptr<OptimizerParamState> fresh;
    try {
      fresh = detail::param_state_from_entries(entries, new_param_state(), p.device(),
                                               [&](const std::string& field, const at::Tensor& t) {
                                                 if (t.dim() > 0 && t.sizes() != p.sizes())
                                                   throw Error(ctx + "the state '" + field + "' of " + name +
                                                               " has shape " + shape_string(t.sizes()) +
                                                               ", not the parameter's");
                                               });
    } catch (const c10::Error& e) {
      throw Error(ctx + "cannot read the state of " + name + ": " + e.what_without_backtrace());
    }
    if (owner_[i] == rank_) local_state[compat::optimizer_state_key(p)] = std::move(fresh);
  }

  // Commit.
  local_->state() = std::move(local_state);
  auto& local_groups = local_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    assign_options(param_groups_[g], *options[g]);
    assign_options(local_groups[g], *options[g]);
  }
  invalidate_consolidated("load_state_dict() ran after consolidate_state_dict()");
}

OptimizerStateDict ZeroRedundancyOptimizerBase::state_dict_from_bytes(const std::string& bytes) const {
  return OptimizerStateDict::from_bytes(bytes, defaults(), [this] { return new_param_state(); });
}

void ZeroRedundancyOptimizerBase::save(OutputArchive& archive) const { state_dict().save(archive); }

void ZeroRedundancyOptimizerBase::load(InputArchive& archive) {
  load_state_dict(OptimizerStateDict::load(archive, defaults(), [this] { return new_param_state(); }));
}

void ZeroRedundancyOptimizerBase::invalidate_consolidated(const std::string& why) {
  if (!consolidated_) return;
  consolidated_.reset();
  consolidated_stale_ = why;
}

}  // namespace fsdpp
