#include "fsdp/fsdp_state.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/error.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/memory.h>

#include "comm/metadata_collectives.h"
#include "fsdp/prefetch_within_bound.h"
#include "memory/peak_since_mark.h"

namespace fsdpp {
namespace detail {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<int64_t, std::weak_ptr<FSDPState>> states;
  // Parameters sharded by a live unit, and that unit's name: sharding one twice is an error.
  std::unordered_map<const c10::TensorImpl*, std::string> sharded;
};

// Tensor bytes alive now on the compute device (the CPU allocator's count).
int64_t live_tensor_bytes() { return memory_stats().current_bytes; }

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: states may die during static destruction
  return *r;
}

// Identity on a tensor; its backward runs before the backward of what produced the tensor
// inside the unit (on outputs: "pre-backward") or after the unit's backward (on inputs).
struct PreBackwardFunction : public torch::autograd::Function<PreBackwardFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, int64_t id, const at::Tensor& x) {
    ctx->saved_data["id"] = id;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (auto state = FSDPState::find(ctx->saved_data["id"].toInt())) state->pre_backward();
    return {at::Tensor(), grads[0]};
  }
};

struct PostBackwardFunction : public torch::autograd::Function<PostBackwardFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, int64_t id, const at::Tensor& x) {
    ctx->saved_data["id"] = id;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (auto state = FSDPState::find(ctx->saved_data["id"].toInt())) state->post_backward_node_fired();
    return {at::Tensor(), grads[0]};
  }
};

}  // namespace

int64_t FSDPState::next_id() {
  static std::atomic<int64_t> next{1};
  return next++;
}

FSDPState::FSDPState(std::string name, std::vector<std::pair<std::string, at::Tensor>> params, UnitGroups groups,
                     const ParamGroupPolicies& policies, std::optional<BackwardPrefetch> backward_prefetch)
    : id_(next_id()),
      name_(std::move(name)),
      process_group_(groups.shard),
      replicate_group_(groups.replicate),
      backward_prefetch_timing_(backward_prefetch) {
  auto& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    for (auto& [fqn, p] : params) {
      auto it = r.sharded.find(p.unsafeGetTensorImpl());
      if (it != r.sharded.end())
        throw Error("fully_shard of " + name_ + ": parameter '" + fqn + "' is already sharded by FSDP unit " +
                    it->second + " (wrap each module once, inner modules first)");
    }
  }
  if (!params.empty()) {
    param_group_.emplace(params, std::move(groups), name_, "unit " + std::to_string(id_) + " (" + name_ + ")", policies);
  }
  compute_device_ = param_group_ ? param_group_->compute_device() : policies.device_id.value_or(at::kCPU);
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& [fqn, p] : params) r.sharded[p.unsafeGetTensorImpl()] = name_;
}

FSDPState::~FSDPState() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.states.erase(id_);
  if (param_group_)
    for (const auto& p : param_group_->fsdp_params()) r.sharded.erase(p.param().unsafeGetTensorImpl());
}

std::shared_ptr<FSDPState> FSDPState::find(int64_t id) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.states.find(id);
  return it == r.states.end() ? nullptr : it->second.lock();
}

void FSDPState::register_self() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.states[id_] = weak_from_this();
}

at::Tensor FSDPState::attach_pre_backward(const at::Tensor& output) {
  return PreBackwardFunction::apply(id_, output);
}

at::Tensor FSDPState::attach_post_backward(const at::Tensor& input) {
  ++post_backward_nodes_expected_;
  return PostBackwardFunction::apply(id_, input);
}

void FSDPState::lazy_init_as_root(const std::vector<std::shared_ptr<FSDPState>>& inner) {
  is_root_ = true;
  lazy_initialized_ = true;
  context_ = std::make_shared<FSDPRootContext>();
  context_->states.push_back(weak_from_this());
  context_->recording_order = true;
  for (const auto& s : inner) {
    if (s.get() == this) continue;
    s->is_root_ = false;
    s->lazy_initialized_ = true;
    s->context_ = context_;
    context_->states.push_back(s);
  }
  // One set of streams for the tree, as FSDP2's root shares its FSDPCommContext: the root's.
  std::shared_ptr<FSDPCommContext> streams = param_group_ ? param_group_->comm_context() : std::make_shared<FSDPCommContext>();
  for (auto& w : context_->states)
    if (auto s = w.lock(); s && s->param_group_) s->param_group_->use_comm_context(streams);
  // FSDP2's root moves the forward's inputs to its accelerator: the first unit's that has one.
  for (auto& w : context_->states)
    if (auto s = w.lock(); s && !s->compute_device_.is_cpu()) {
      input_device_ = s->compute_device_;
      break;
    }
}

namespace {
void append_once(std::vector<std::weak_ptr<FSDPState>>& order, FSDPState* s) {
  for (auto& w : order)
    if (w.lock().get() == s) return;
  order.push_back(s->weak_from_this());
}
}  // namespace

void FSDPState::pre_forward() {
  if (is_root_ && !context_->final_callback_queued) {
    // Outside backward no unit can be mid-backward: clear what a backward that threw left.
    for (auto& w : context_->states)
      if (auto s = w.lock()) {
        s->ran_pre_backward_ = false;
        s->ran_post_backward_ = false;
        if (s->param_group_) s->param_group_->finalize_backward();
      }
  }
  training_state_ = TrainingState::kForward;
  if (context_ && context_->recording_order) append_once(context_->forward_order, this);
  // Waiting before prefetching, as FSDP2 does.
  if (param_group_) {
    param_group_->unshard();
    param_group_->wait_for_unshard();
  }
  if (has_explicit_forward_prefetch_) {
    for (auto& w : explicit_forward_prefetch_)
      if (auto target = w.lock())
        if (target->param_group_) target->param_group_->unshard();
  } else if (auto next = forward_prefetch_target_.lock()) {
    if (next->param_group_) next->param_group_->unshard();
  }
}

void FSDPState::post_forward() {
  // Without grad mode (evaluation) no backward follows to reshard the unit, and a unit left
  // unsharded hides its sharded `.grad` from the optimizer's zero_grad: the stale gradient would
  // come back and be added to the next step's. So every unit, the root too, reshards now.
  if (param_group_ && !torch::autograd::GradMode::is_enabled())
    param_group_->reshard();
  else if (param_group_ && !is_root_)
    param_group_->reshard_after_forward();
  training_state_ = TrainingState::kIdle;
  if (context_ && context_->recording_order) {
    append_once(context_->post_forward_order, this);
    if (is_root_) link_prefetch_order();
  }
  if (is_root_ && torch::autograd::GradMode::is_enabled()) context_->live_bytes_after_forward = live_tensor_bytes();
}


void FSDPState::link_prefetch_order() {
  context_->recording_order = false;
  const auto& forward = context_->forward_order;
  const auto& post_forward = context_->post_forward_order;
  for (size_t i = 0; i + 1 < forward.size(); ++i)
    if (auto s = forward[i].lock()) s->forward_prefetch_target_ = forward[i + 1];
  for (size_t i = 1; i < post_forward.size(); ++i)
    if (auto s = post_forward[i].lock()) s->backward_prefetch_target_ = post_forward[i - 1];
}

void FSDPState::pre_backward() {
  queue_final_callback();
  if (ran_pre_backward_) return;
  ran_pre_backward_ = true;
  training_state_ = TrainingState::kPreBackward;
  const bool measuring = context_ && !context_->backward_prefetch_decided;
  if (measuring) close_measurement_window(*context_);
  if (param_group_) {
    param_group_->unshard(UnshardFor::kBackward);
    param_group_->wait_for_unshard();
  }
  if (measuring) {
    if (context_->measured_order.empty()) context_->gradient_shard_bytes_at_start = gradient_shard_bytes(*context_);
    detail::mark_peak_bytes();
    context_->measuring = weak_from_this();
    context_->measured_order.push_back(weak_from_this());
  }
  if (prefetches_at_pre_backward()) prefetch_for_backward();
}

int64_t FSDPState::gradient_shard_bytes(const FSDPRootContext& context) {
  int64_t bytes = 0;
  for (const auto& w : context.states)
    if (auto s = w.lock())
      if (s->param_group_ && !s->param_group_->is_unsharded())  // (an unsharded unit's .grad is full)
        for (const auto& p : s->param_group_->fsdp_params())
          if (p.param().grad().defined()) bytes += static_cast<int64_t>(p.param().grad().nbytes());
  return bytes;
}

void FSDPState::close_measurement_window(FSDPRootContext& context) {
  if (auto s = context.measuring.lock()) {
    s->window_peak_ =
        detail::peak_bytes_since_mark() - (gradient_shard_bytes(context) - context.gradient_shard_bytes_at_start);
  }
  context.measuring.reset();
}

void FSDPState::prefetch_for_backward() {
  auto prefetch = [](const std::shared_ptr<FSDPState>& target) {
    if (target && target->param_group_ && !target->ran_post_backward_)
      target->param_group_->unshard(UnshardFor::kBackward);
  };
  if (has_explicit_backward_prefetch_) {
    for (auto& w : explicit_backward_prefetch_) prefetch(w.lock());
  } else if (backward_prefetch_timing_ == BackwardPrefetch::BACKWARD_PRE_WITHIN_BOUND) {
    if (prefetch_within_bound_) prefetch(backward_prefetch_target_.lock());
  } else if (backward_prefetch_timing_) {
    prefetch(backward_prefetch_target_.lock());
  }
}

void FSDPState::decide_backward_prefetch(FSDPRootContext& context,
                                         const std::vector<std::shared_ptr<FSDPState>>& states) {
  std::unordered_map<const FSDPState*, int> index;
  for (size_t i = 0; i < states.size(); ++i) index[states[i].get()] = static_cast<int>(i);
  BackwardWindows windows;
  windows.live_after_forward = context.live_bytes_after_forward;
  for (const auto& w : context.measured_order)
    if (const auto s = w.lock(); s && index.count(s.get())) windows.order.push_back(index[s.get()]);
  // Only windows this context's first backward measured: a unit measured earlier as a root of
  // its own keeps an older peak.
  std::vector<char> measured(states.size(), 0);
  for (int i : windows.order) measured[static_cast<size_t>(i)] = 1;
  std::vector<PrefetchUnit> units(states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    const FSDPState& s = *states[i];
    windows.peak.push_back(measured[i] ? s.window_peak_ : -1);
    if (s.param_group_) {
      units[i].gathered = s.param_group_->unsharded_compute_bytes();
      units[i].reduce_input = s.param_group_->unsharded_reduce_bytes();
      units[i].shard_group = s.process_group_.size();
    }
    const auto target = s.backward_prefetch_target_.lock();
    if (s.prefetches_within_bound() && target && target->param_group_ && index.count(target.get()))
      units[i].target = index[target.get()];
  }
  const std::vector<bool> prefetches = decide_prefetch_within_bound(windows, units);
  const std::vector<int32_t> fits(prefetches.begin(), prefetches.end());
  // Ranks measure different bytes; a prefetch issued on one rank and not on another would put
  // their collectives in different orders.
  const FSDPState& root = *states.front();
  at::Tensor agreed = at::tensor(fits, at::kInt);
  metadata_all_reduce(agreed, ReduceOp::MIN, root.process_group_);
  if (root.replicate_group_.defined() && root.replicate_group_.size() > 1)
    metadata_all_reduce(agreed, ReduceOp::MIN, root.replicate_group_);
  for (size_t i = 0; i < states.size(); ++i) states[i]->prefetch_within_bound_ = agreed[static_cast<int64_t>(i)].item<int32_t>() != 0;
}

void FSDPState::post_backward_node_fired() {
  ++post_backward_nodes_fired_;
  if (post_backward_nodes_fired_ >= post_backward_nodes_expected_) post_backward();
}

void FSDPState::post_backward() {
  if (ran_post_backward_) return;
  ran_post_backward_ = true;
  training_state_ = TrainingState::kPostBackward;
  // Reduce-scatters that already finished free their buffers now rather than at the end of
  // backward, so backward's memory does not grow with the number of units: before this unit's
  // reduce-scatter buffers are allocated, and again after.
  finalize_finished_reduce_scatters();
  const bool prefetch_now = !prefetches_at_pre_backward();
  if (param_group_)
    param_group_->post_backward([&] {
      if (prefetch_now) prefetch_for_backward();
    });
  else if (prefetch_now)
    prefetch_for_backward();
  finalize_finished_reduce_scatters();
}

void FSDPState::finalize_finished_reduce_scatters() {
  if (!context_) return;
  for (auto& w : context_->states)
    if (auto s = w.lock())
      if (s->param_group_ && s->param_group_->reduce_scatter_done()) s->param_group_->finalize_backward();
}

void FSDPState::queue_final_callback() {
  if (!context_ || context_->final_callback_queued) return;
  context_->final_callback_queued = true;
  std::weak_ptr<FSDPRootContext> context = context_;
  torch::autograd::Engine::get_default_engine().queue_callback([context] {
    if (auto c = context.lock()) final_callback(*c);
  });
}

void FSDPState::final_callback(FSDPRootContext& context) {
  context.final_callback_queued = false;
  std::vector<std::shared_ptr<FSDPState>> states;
  for (auto& w : context.states)
    if (auto s = w.lock()) states.push_back(std::move(s));
  // Units whose post-backward did not run from their inputs (inputs that needed no grad, or
  // an input branch backward never reached) finish now, innermost last registered first.
  for (auto it = states.rbegin(); it != states.rend(); ++it) {
    FSDPState& s = **it;
    if (!s.ran_post_backward_ && s.param_group_ && (s.ran_pre_backward_ || s.param_group_->is_unsharded())) s.post_backward();
  }
  // Each unit's own flag: set_is_last_backward(false) on an inner unit leaves only its
  // reduce-scatter in flight.
  for (auto& s : states)
    if (s->param_group_ && s->is_last_backward_) s->param_group_->finalize_backward();
  // Drops prefetched gathers and post-forward shards of units that did not run backward.
  for (auto& s : states)
    if (s->param_group_) {
      s->param_group_->drop_pending_unshard();
      if (!s->param_group_->is_unsharded()) s->param_group_->reshard();
    }
  for (auto& s : states) s->reset_iteration();
  if (!context.backward_prefetch_decided) {
    close_measurement_window(context);
    if (std::any_of(states.begin(), states.end(), [](const auto& s) { return s->prefetches_within_bound(); }))
      decide_backward_prefetch(context, states);
    context.backward_prefetch_decided = true;
  }
}

void FSDPState::reset_iteration() {
  training_state_ = TrainingState::kIdle;
  ran_pre_backward_ = false;
  ran_post_backward_ = false;
  post_backward_nodes_expected_ = 0;
  post_backward_nodes_fired_ = 0;
}

}  // namespace detail
}  // namespace fsdpp
