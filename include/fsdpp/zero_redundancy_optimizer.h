#pragma once
// ZeroRedundancyOptimizer (ZeRO stage 1, PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer).
//
//   fsdpp::ZeroRedundancyOptimizer<torch::optim::Adam> opt(model->parameters(),
//                                                         torch::optim::AdamOptions(1e-3), world);
//   loss.backward();  // gradients already averaged across ranks (DDP, or all_reduce)
//   opt.step();       // each rank updates its shard, then broadcasts it to the others
//
// Every rank owns a partition of the parameters (PyTorch's sorted-greedy algorithm) and keeps
// optimizer state for that partition only, so per-rank optimizer state is about 1/N.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <fsdpp/error.h>
#include <fsdpp/optimizer_state_dict.h>
#include <fsdpp/join.h>
#include <fsdpp/optimizer_traits.h>
#include <fsdpp/process_group.h>
#include <fsdpp/work.h>

namespace fsdpp {

// The optimizer-independent part. It is a torch::optim::Optimizer (so LR schedulers such as
// torch::optim::StepLR drive it): its param_groups() hold all parameters with the options that
// apply to them; the wrapped optimizer (optim()) holds this rank's partition only. Option
// changes made through param_groups() (e.g. by a scheduler) reach the wrapped optimizer at the
// next step(); option changes the wrapped optimizer makes during its step are copied back
// after it. (Note: torch::optim::Optimizer's non-virtual members called through a base
// reference, add_param_group and state(), see the unsharded base: use this class's own.)
class ZeroRedundancyOptimizerBase : public torch::optim::Optimizer, public Joinable {
 public:
  using LossClosure = torch::optim::Optimizer::LossClosure;

  ZeroRedundancyOptimizerBase(const ZeroRedundancyOptimizerBase&) = delete;
  ZeroRedundancyOptimizerBase& operator=(const ZeroRedundancyOptimizerBase&) = delete;
  ~ZeroRedundancyOptimizerBase() override;

  // With overlap_with_ddp(): does nothing and returns an undefined tensor (the DDP hook
  // already stepped every bucket during backward); a closure is an error.
  // Otherwise: runs the wrapped optimizer's step on this rank's partition (calling `closure`, if any, as
  // the wrapped optimizer does: on every rank), then broadcasts each rank's updated partition.
  // Returns the closure's loss. Collective: every rank of the group must call it. If the wrapped
  // step throws (e.g. the closure throws), the error propagates before any parameter or state
  // changed and before the broadcasts (inside a Join context, after its notification).
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Clears the gradients of all parameters (not just this rank's partition): resets them with
  // set_to_none (PyTorch's default), or zeroes them.
  void zero_grad(bool set_to_none = true);

  // Adds a parameter group and partitions its parameters (continuing the sorted-greedy
  // assignment of the existing groups, which therefore keep their owners). A group without
  // options gets the constructor's options. Local; every rank must add the same group.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);

  // Gathers the optimizer state of all partitions on group rank `to` (collective). state_dict()
  // is then available on that rank until the next step, load_state_dict or add_param_group.
  void consolidate_state_dict(int to = 0);
  // The consolidated state (positional keys "0", "1", ... as in param_groups()). Throws on a rank
  // that did not consolidate, or when the consolidated state went stale.
  OptimizerStateDict state_dict() const;
  // Restores state and options (the loaded options win over the constructor's) from a state
  // dict of the whole optimizer, saved at any world size (or by a plain optimizer with the same
  // param groups). Local, no communication. Validates everything first (group and parameter
  // counts, option and state types, state tensor shapes) and changes nothing on error.
  void load_state_dict(const OptimizerStateDict& state_dict);
  // Parses bytes written by OptimizerStateDict::to_bytes (or torch::save of an optimizer of
  // this type) with this optimizer's types.
  OptimizerStateDict state_dict_from_bytes(const std::string& bytes) const;

  // torch::save(zero, ...) / torch::load(zero, ...): save needs a consolidated state dict on
  // this rank; load is load_state_dict.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // The wrapped optimizer, over this rank's partition (PyTorch's `optim` attribute).
  torch::optim::Optimizer& optim() { return *local_; }
  const torch::optim::Optimizer& optim() const { return *local_; }

  const ProcessGroup& process_group() const { return group_; }
  int rank() const { return rank_; }  // in process_group()
  int world_size() const { return world_size_; }
  bool parameters_as_bucket_view() const { return bucket_view_; }

  // All parameters, in param_groups() order (their indices in state dicts).
  const std::vector<torch::Tensor>& params() const { return all_params_; }
  // The group rank that owns each parameter (indexed like params()).
  const std::vector<int>& param_owners() const { return owner_; }
  // Indices of the parameters each group rank owns, in broadcast order.
  const std::vector<std::vector<int64_t>>& partition() const { return rank_params_; }
  // With parameters_as_bucket_view: one flat buffer per group rank holding that rank's
  // partition (its parameters are views into it); empty otherwise.
  const std::vector<torch::Tensor>& buckets() const { return buckets_; }

  // ---- Overlap with DDP (fsdpp/ddp_zero_hook.h; PyTorch's overlap_with_ddp=True) ----
  // Re-partitions by DDP bucket instead of sorted-greedy: `buckets` lists this optimizer's
  // parameters bucket by bucket (every parameter exactly once). Without `shard_buckets`,
  // bucket b belongs wholly to group rank b % world_size(). With it (PyTorch's
  // shard_buckets=True), a bucket may be split into runs of consecutive parameters owned by
  // different ranks, to even out the ranks' shares: buckets are taken smallest first, a run
  // closes before the parameter that would bring it to total / world_size() elements, and
  // each run goes to the rank with the fewest elements so far that holds no other run of the
  // bucket (or, when every rank holds one, where PyTorch gives up, to the rank with the fewest).
  // Only before the first step, without parameters_as_bucket_view. Afterwards step() is a
  // no-op (the DDP hook steps each bucket during backward), and add_param_group is refused.
  // Local; every rank must pass the same buckets.
  void partition_by_buckets(const std::vector<std::vector<torch::Tensor>>& buckets, bool shard_buckets = false);
  bool overlap_with_ddp() const { return !bucket_params_.empty(); }
  size_t num_overlap_buckets() const { return bucket_params_.size(); }
  // Steps bucket b: each owner of part of the bucket runs the wrapped optimizer on its part
  // only, with `gradients` (one per parameter of the bucket, in partition_by_buckets order; an
  // undefined one skips its parameter) or, when `gradients` is empty, with their `.grad`
  // (other parameters' `.grad` is untouched). Then each owner broadcasts its part on `group`
  // (collective: every rank of `group`, which must have the ranks of process_group(), calls
  // it for the same bucket in the same order).
  void step_bucket(size_t b, const std::vector<torch::Tensor>& gradients, const ProcessGroup& group);

  // Joinable: a joined rank's hook runs step() (with the gradients it has), keeping the
  // broadcasts of the ranks still training matched.
  std::unique_ptr<JoinHook> join_hook() override;
  ProcessGroup join_process_group() const override { return group_; }
  c10::Device join_device() const override;

 protected:
  ZeroRedundancyOptimizerBase(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                              std::unique_ptr<torch::optim::OptimizerOptions> defaults, const ProcessGroup& group,
                              bool parameters_as_bucket_view);
  // Validates the parameters (before torch::optim::Optimizer sees them).
  static std::vector<torch::optim::OptimizerParamGroup> checked(
      std::vector<torch::optim::OptimizerParamGroup> groups,
      const std::function<bool(const torch::optim::OptimizerOptions&)>& options_ok, const std::string& options_name);
  // Called by the derived constructor: partitions and builds the wrapped optimizer.
  void initialize();

  // Around the wrapped optimizer's step.
  void before_step();
  void after_step();

  virtual std::unique_ptr<torch::optim::Optimizer> make_local_optimizer(
      std::vector<torch::optim::OptimizerParamGroup> groups) const = 0;
  virtual std::unique_ptr<torch::optim::OptimizerParamState> new_param_state() const = 0;
  virtual bool options_compatible(const torch::optim::OptimizerOptions& options) const = 0;
  virtual std::string options_type_name() const = 0;
  // dst := src, in place when both are exactly the options type (keeps references valid).
  virtual void assign_options(torch::optim::OptimizerParamGroup& dst, const torch::optim::OptimizerOptions& src) const = 0;

 private:
  // Broadcasts started by broadcast_params, finished by wait().
  struct PendingBroadcasts {
    std::vector<Work> works;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back;  // (parameter, contiguous staging)
    void wait();
  };

  // Partitioning (partition.cpp).
  void partition_group(size_t group_index);
  void build_buckets();
  void check_no_duplicates(const std::vector<torch::Tensor>& params) const;
  // The wrapped optimizer (local_optimizer.cpp).
  std::vector<torch::Tensor> local_params(size_t group_index) const;
  void build_local_optimizer();
  void push_options();  // param_groups() -> the wrapped optimizer
  void pull_options();  // the wrapped optimizer -> param_groups()
  void sync_params();
  void broadcast_params(const std::vector<int64_t>& indices, int src, const ProcessGroup& group,
                        PendingBroadcasts& pending);
  // State dicts (zero_state_dict.cpp).
  void invalidate_consolidated(const std::string& why);

  ProcessGroup group_;
  int rank_ = 0;
  int world_size_ = 1;
  bool bucket_view_ = false;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::vector<torch::Tensor> all_params_;
  std::vector<int> owner_;
  std::vector<size_t> group_of_;  // param index -> group index
  std::vector<int64_t> rank_sizes_;  // elements assigned to each rank so far
  std::vector<std::vector<int64_t>> rank_params_;
  std::vector<torch::Tensor> buckets_;
  std::unique_ptr<OptimizerStateDict> consolidated_;
  std::string consolidated_stale_;  // why consolidated_ went stale, if it did
  int64_t steps_ = 0;
  std::vector<std::vector<int64_t>> bucket_params_;  // overlap_with_ddp: parameter indices per bucket
  // overlap_with_ddp: per bucket, the owner of each of its runs of parameters, and where they
  // start in bucket_params_[b] (a run ends where the next begins).
  struct BucketRun {
    int owner;
    size_t begin;
  };
  std::vector<std::vector<BucketRun>> bucket_runs_;
};

// Wraps any torch::optim optimizer `O` constructible as O(std::vector<OptimizerParamGroup>,
// Options) (libtorch's SGD, Adam, AdamW, RMSprop, Adagrad, and user subclasses of them).
// The parameters must be dense, of one dtype, and not empty; group options must be of the
// optimizer's options type.
template <typename O>
class ZeroRedundancyOptimizer : public ZeroRedundancyOptimizerBase {
 public:
  using Options = typename OptimizerTraits<O>::Options;
  using ParamState = typename OptimizerTraits<O>::ParamState;

  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups, const Options& defaults,
                          const ProcessGroup& group = {}, bool parameters_as_bucket_view = false)
      : ZeroRedundancyOptimizerBase(checked(std::move(param_groups), &is_options, options_name()),
                                    std::make_unique<Options>(defaults), group, parameters_as_bucket_view),
        defaults_value_(defaults) {
    initialize();
  }

  ZeroRedundancyOptimizer(std::vector<torch::Tensor> params, const Options& defaults, const ProcessGroup& group = {},
                          bool parameters_as_bucket_view = false)
      : ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
                                defaults, group, parameters_as_bucket_view) {}

  using ZeroRedundancyOptimizerBase::step;

  // step(closure, extra arguments...): forwards the extra arguments to the wrapped optimizer's
  // own step overload (PyTorch's step(closure, **kwargs)).
  template <typename Arg, typename... Args>
  torch::Tensor step(LossClosure closure, Arg&& arg, Args&&... args) {
    before_step();
    torch::Tensor loss = optim().step(std::move(closure), std::forward<Arg>(arg), std::forward<Args>(args)...);
    after_step();
    return loss;
  }

  O& optim() { return static_cast<O&>(ZeroRedundancyOptimizerBase::optim()); }
  const O& optim() const { return static_cast<const O&>(ZeroRedundancyOptimizerBase::optim()); }

 protected:
  std::unique_ptr<torch::optim::Optimizer> make_local_optimizer(
      std::vector<torch::optim::OptimizerParamGroup> groups) const override {
    return std::make_unique<O>(std::move(groups), defaults_value_);
  }
  std::unique_ptr<torch::optim::OptimizerParamState> new_param_state() const override {
    return std::make_unique<ParamState>();
  }
  bool options_compatible(const torch::optim::OptimizerOptions& options) const override { return is_options(options); }
  std::string options_type_name() const override { return options_name(); }
  void assign_options(torch::optim::OptimizerParamGroup& dst, const torch::optim::OptimizerOptions& src) const override {
    if (dst.has_options() && typeid(dst.options()) == typeid(Options) && typeid(src) == typeid(Options))
      static_cast<Options&>(dst.options()) = static_cast<const Options&>(src);
    else
      dst.set_options(src.clone());
  }

 private:
  static bool is_options(const torch::optim::OptimizerOptions& options) {
    return dynamic_cast<const Options*>(&options) != nullptr;
  }
  static std::string options_name();

  Options defaults_value_;
};

namespace detail {
std::string demangled(const std::type_info& type);
}

template <typename O>
std::string ZeroRedundancyOptimizer<O>::options_name() {
  return detail::demangled(typeid(Options));
}

}  // namespace fsdpp
