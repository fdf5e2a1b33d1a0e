#pragma once
// The forward/backward logic of one FSDP unit: root detection and lazy init, the
// pre/post-forward steps, the backward triggers and the root's end-of-backward callback.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/fully_shard_options.h>
#include <fsdpp/process_group.h>

#include "fsdp/fsdp_param_group.h"

namespace fsdpp::detail {

enum class TrainingState { kIdle, kForward, kPreBackward, kPostBackward };

class FSDPState;

// What the units of one root's tree share (FSDP2's FSDPStateContext), made by the root's lazy
// init: the units, the order they ran forward in during the first iteration (for implicit
// prefetching), and whether the end-of-backward callback is queued.
struct FSDPRootContext {
  std::vector<std::weak_ptr<FSDPState>> states;  // the root first, then the units inside
  bool recording_order = false;
  std::vector<std::weak_ptr<FSDPState>> forward_order, post_forward_order;
  bool final_callback_queued = false;
  // BACKWARD_PRE_WITHIN_BOUND. Until the first backward's end has turned its measurements into
  // each unit's decision: the tensor bytes alive when the root's last training forward ended,
  // and the unit whose measurement window is open.
  bool backward_prefetch_decided = false;
  int64_t live_bytes_after_forward = 0;
  std::weak_ptr<FSDPState> measuring;
  std::vector<std::weak_ptr<FSDPState>> measured_order;  // the windows, in backward's order
  // Gradient shards alive when the first window opened: those the measured backward creates
  // (none existed before the first step, or zero_grad dropped them) are taken out of its windows,
  // so the decision also holds when a later step finds every shard already there (zeroed in place).
  int64_t gradient_shard_bytes_at_start = 0;
};

class FSDPState : public std::enable_shared_from_this<FSDPState> {
 public:
  FSDPState(std::string name, std::vector<std::pair<std::string, at::Tensor>> params, UnitGroups groups,
            const ParamGroupPolicies& policies, std::optional<BackwardPrefetch> backward_prefetch);
  ~FSDPState();

  // Autograd nodes find the state by id, so a graph that outlives the module is harmless.
  int64_t id() const { return id_; }
  static std::shared_ptr<FSDPState> find(int64_t id);
  // Makes the state findable by id; call once it is owned by a shared_ptr.
  void register_self();

  const std::string& name() const { return name_; }
  FSDPParamGroup* param_group() { return param_group_ ? &*param_group_ : nullptr; }
  const FSDPParamGroup* param_group() const { return param_group_ ? &*param_group_ : nullptr; }
  const ProcessGroup& process_group() const { return process_group_; }
  bool is_root() const { return is_root_; }
  bool lazy_initialized() const { return lazy_initialized_; }
  // Where the unit computes: its parameter group's device, else device_id, else the CPU (a unit
  // whose parameters all belong to inner units still places its modules' buffers there).
  const at::Device& compute_device() const { return compute_device_; }
  // The root's: the accelerator its forward's tensor inputs are moved to (none on the CPU).
  const std::optional<at::Device>& input_device() const { return input_device_; }
  // Between this unit's pre-forward and post-forward, or inside a backward of its tree.
  bool in_forward_or_backward() const {
    return training_state_ != TrainingState::kIdle || (context_ && context_->final_callback_queued);
  }
  // Off: the end of backward does not wait for this tree's reduce-scatters (more
  // microbatches follow); they finish at the next forward or backward.
  void set_is_last_backward(bool v) { is_last_backward_ = v; }

  // Called on the first forward of the outermost unit with every unit inside it.
  void lazy_init_as_root(const std::vector<std::shared_ptr<FSDPState>>& inner);

  // Explicit prefetch targets (set_modules_to_forward_prefetch / ..._backward_prefetch):
  // when set, they replace the implicit next/previous unit.
  void set_forward_prefetch(std::vector<std::weak_ptr<FSDPState>> targets) {
    explicit_forward_prefetch_ = std::move(targets);
    has_explicit_forward_prefetch_ = true;
  }
  void set_backward_prefetch(std::vector<std::weak_ptr<FSDPState>> targets) {
    explicit_backward_prefetch_ = std::move(targets);
    has_explicit_backward_prefetch_ = true;
  }

  void pre_forward();
  void post_forward();
  // An alias of a forward output whose backward runs pre_backward first.
  at::Tensor attach_pre_backward(const at::Tensor& output);
  // An alias of a forward input whose backward counts towards post_backward (which runs
  // once every input attached in this forward saw its gradient).
  at::Tensor attach_post_backward(const at::Tensor& input);
  void pre_backward();
  // A post-backward node fired; the unit's post-backward runs when all of them did.
  void post_backward_node_fired();
  void post_backward();

 private:
  // Copies the finished reduce-scatters' outputs into `.grad` and frees them.
  void finalize_finished_reduce_scatters();
  // Implicit prefetching: during the root's first forward the units record the order they
  // start and finish forward; afterwards each unit's pre-forward starts the next unit's
  // all-gather, and each unit's pre-backward (post-backward under BACKWARD_POST) the one that
  // runs backward after it (the unit that finished forward before it).
  void link_prefetch_order();
  // Starts the all-gathers of the units whose backward follows this one's (the explicit list,
  // else the implicit previous unit) that have not run their post-backward yet.
  void prefetch_for_backward();
  // An explicit list has to run at one of the two points: at pre-backward unless BACKWARD_POST.
  bool prefetches_at_pre_backward() const { return backward_prefetch_timing_ != BackwardPrefetch::BACKWARD_POST; }
  // Whether this unit's implicit backward prefetch is BACKWARD_PRE_WITHIN_BOUND's.
  bool prefetches_within_bound() const {
    return backward_prefetch_timing_ == BackwardPrefetch::BACKWARD_PRE_WITHIN_BOUND && !has_explicit_backward_prefetch_;
  }
  // The first backward's measurement: each unit's window runs from the moment its parameters are
  // gathered to the next unit's pre-backward (where, without prefetch, that unit gathers), and
  // its peak is the highest tensor memory in it.
  static void close_measurement_window(FSDPRootContext& context);
  // Bytes of the `.grad` of the tree's sharded parameters (not of a unit computing unsharded).
  static int64_t gradient_shard_bytes(const FSDPRootContext& context);
  // After it, each unit's decision by fsdp/prefetch_within_bound.h's rule on those windows. The
  // ranks of the root's groups agree on the minimum: fewer prefetches only lower the later
  // windows, so every rank's set stays within its bound.
  static void decide_backward_prefetch(FSDPRootContext& context, const std::vector<std::shared_ptr<FSDPState>>& states);
  void queue_final_callback();
  static void final_callback(FSDPRootContext& context);
  void reset_iteration();

  static int64_t next_id();

  int64_t id_;
  std::string name_;
  ProcessGroup process_group_;
  ProcessGroup replicate_group_;  // HSDP; empty otherwise
  std::optional<FSDPParamGroup> param_group_;
  bool is_last_backward_ = true;
  bool is_root_ = false;
  at::Device compute_device_ = at::kCPU;
  std::optional<at::Device> input_device_;
  bool lazy_initialized_ = false;
  std::shared_ptr<FSDPRootContext> context_;  // shared by the tree; null before lazy init
  // When this unit prefetches for backward; none: only an explicit list, at pre-backward.
  std::optional<BackwardPrefetch> backward_prefetch_timing_;
  std::weak_ptr<FSDPState> forward_prefetch_target_, backward_prefetch_target_;
  bool has_explicit_forward_prefetch_ = false, has_explicit_backward_prefetch_ = false;
  std::vector<std::weak_ptr<FSDPState>> explicit_forward_prefetch_, explicit_backward_prefetch_;
  // BACKWARD_PRE_WITHIN_BOUND: the peak of this unit's window in the first backward (-1: not
  // reached), and the decision taken from it.
  int64_t window_peak_ = -1;
  bool prefetch_within_bound_ = false;
  TrainingState training_state_ = TrainingState::kIdle;
  bool ran_pre_backward_ = false;
  bool ran_post_backward_ = false;
  int post_backward_nodes_expected_ = 0;
  int post_backward_nodes_fired_ = 0;
};

}  // namespace fsdpp::detail
