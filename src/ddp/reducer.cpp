#include "ddp/reducer.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <unordered_set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

namespace fsdpp::detail {
namespace {

// True when `grad` is exactly the bucket view (same memory, same shape).
bool is_bucket_view(const at::Tensor& grad, const at::Tensor& view) {
  return grad.defined() && grad.is_alias_of(view) && grad.data_ptr() == view.data_ptr() &&
         grad.sizes() == view.sizes() && grad.strides() == view.strides();
}

std::string quoted_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
  return out;
}

}  // namespace

// Fires after AccumulateGrad wrote the parameter's `.grad`. Holds the reducer weakly: the
// reducer owns the accumulators, so a strong reference would keep both alive forever.
class Reducer::GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::weak_ptr<Reducer> reducer, size_t index) : reducer_(std::move(reducer)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto reducer = reducer_.lock()) reducer->on_gradient(index_);
    return outputs;
  }

 private:
  std::weak_ptr<Reducer> reducer_;
  size_t index_;
};

std::shared_ptr<Reducer> Reducer::create(std::vector<NamedTensor> parameters, ProcessGroup group,
                                         DistributedDataParallelOptions options) {
  std::shared_ptr<Reducer> reducer(new Reducer(std::move(parameters), std::move(group), std::move(options)));
  reducer->install_hooks();
  return reducer;
}

Reducer::Reducer(std::vector<NamedTensor> parameters, ProcessGroup group, DistributedDataParallelOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  for (auto& p : parameters) {
    Param param;
    param.name = std::move(p.name);
    param.tensor = std::move(p.tensor);
    params_.push_back(std::move(param));
  }
  const size_t n = params_.size();
  ready_.assign(n, 0);
  got_gradient_.assign(n, 0);
  used_since_sync_.assign(n, 0);
  globally_used_.assign(n, 1);
  reachable_.assign(n, 0);
  hook_calls_.assign(n, 0);
  build_buckets();
}

Reducer::~Reducer() {
  for (auto& p : params_)
    if (p.accumulator) p.accumulator->del_post_hook(p.hook_key);
}

// Parameters in reverse registration order (roughly the order backward produces their
// gradients), one open bucket per dtype and device; a bucket closes when the next parameter
// would take it past the cap.
void Reducer::build_buckets() {
  const double cap_bytes = options_.bucket_cap_mb() * 1024.0 * 1024.0;
  // As PyTorch, the first bucket (the last layers' gradients) holds at most 1 MiB, so its
  // all_reduce starts early in backward and overlaps the rest.
  const double first_cap_bytes = std::min(cap_bytes, 1024.0 * 1024.0);
  struct Open {
    std::vector<size_t> params;
    int64_t bytes = 0;
    bool first = true;
  };
  std::map<std::pair<int, std::string>, Open> open;
  std::vector<std::vector<size_t>> groups;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& t = params_[k].tensor;
    auto key = std::make_pair(static_cast<int>(t.scalar_type()), t.device().str());
    Open& bucket = open[key];
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    const double cap = bucket.first ? first_cap_bytes : cap_bytes;
    if (!bucket.params.empty() && static_cast<double>(bucket.bytes + bytes) > cap) {
      groups.push_back(std::move(bucket.params));
      bucket = Open{};
      bucket.first = false;
    }
    bucket.params.push_back(k);
    bucket.bytes += bytes;
  }
  for (auto& [key, bucket] : open)
    if (!bucket.params.empty()) groups.push_back(std::move(bucket.params));
  // Reduction order: by where each bucket's first parameter comes in the reversed order.
  std::stable_sort(groups.begin(), groups.end(),
                   [](const std::vector<size_t>& a, const std::vector<size_t>& b) { return a.front() > b.front(); });

  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < groups.size(); ++b) {
    Bucket bucket;
    int64_t total = 0;
    for (size_t k : groups[b]) total += params_[k].tensor.numel();
    const at::Tensor& first = params_[groups[b].front()].tensor;
    GradBucket& g = bucket.grad_bucket;
    g.index_ = b;
    g.is_last_ = b + 1 == groups.size();
    g.process_group_ = group_;
    g.buffer_ = at::zeros({total}, first.options().requires_grad(false));
    int64_t offset = 0;
    for (size_t k : groups[b]) {
      Param& p = params_[k];
      p.bucket = b;
      p.slot = bucket.params.size();
      bucket.params.push_back(k);
      g.parameters_.push_back(p.tensor);
      g.parameter_names_.push_back(p.name);
      g.offsets_.push_back(offset);
      // detach(): a plain tensor sharing the bucket's memory, not an autograd view, so that
      // optimizers may detach_() and zero_() it when it serves as `.grad`.
      g.gradients_.push_back(g.buffer_.narrow(0, offset, p.tensor.numel()).view(p.tensor.sizes()).detach());
      offset += p.tensor.numel();
    }
    buckets_.push_back(std::move(bucket));
  }

  if (options_.gradient_as_bucket_view()) {
    // Existing gradients move into the buckets now; new ones are placed there by the hooks.
    for (auto& p : params_) {
      at::Tensor& grad = p.tensor.mutable_grad();
      if (!grad.defined()) continue;
      const at::Tensor& view = buckets_[p.bucket].grad_bucket.gradients_[p.slot];
      view.copy_(grad);
      grad = view;
    }
  }
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> self = shared_from_this();
  for (size_t k = 0; k < params_.size(); ++k) {
    Param& p = params_[k];
    p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
    if (!p.accumulator)
      throw Error("DistributedDataParallel: parameter '" + p.name + "' has no gradient accumulator (is it a leaf that requires grad?)");
    p.hook_key = p.accumulator->add_post_hook(std::make_unique<GradReadyHook>(self, k));
  }
}

bool Reducer::set_sync_enabled(bool enabled) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const bool previous = sync_enabled_;
  sync_enabled_ = enabled;
  return previous;
}

void Reducer::register_comm_hook(CommHook hook) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!hook) throw Error("DistributedDataParallel::register_comm_hook: the hook is empty");
  if (comm_hook_) throw Error("DistributedDataParallel::register_comm_hook: a comm hook is already registered (it can be registered only once)");
  if (in_backward_) throw Error("DistributedDataParallel::register_comm_hook: cannot register a comm hook during backward");
  comm_hook_ = std::move(hook);
}

void Reducer::register_bucket_reduced_callback(BucketReducedCallback callback) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!callback) throw Error("DistributedDataParallel::register_bucket_reduced_callback: the callback is empty");
  reduced_callbacks_.push_back(std::move(callback));
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  // Nothing to backpropagate (evaluation, or under NoGradGuard): keep what earlier forwards found.
  if (std::none_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); }))
    return;
  // An output's gradient is computed in the backward the user started, before any parameter's:
  // beginning there queues finalize_backward on that backward, not on one nested in it.
  std::weak_ptr<Reducer> self = shared_from_this();
  for (const at::Tensor& out : outputs)
    if (out.defined() && out.requires_grad())
      out.register_hook([self](const at::Tensor&) {
        if (auto reducer = self.lock()) reducer->on_output_gradient();
      });
  if (!options_.find_unused_parameters() || options_.static_graph()) return;  // static_graph knows the unused ones
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const at::Tensor& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    auto edge = torch::autograd::impl::gradient_edge(out);
    if (edge.function && seen.insert(edge.function.get()).second) stack.push_back(edge.function.get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges())
      if (edge.function && seen.insert(edge.function.get()).second) stack.push_back(edge.function.get());
  }
  for (size_t k = 0; k < params_.size(); ++k)
    if (seen.count(params_[k].accumulator.get())) reachable_[k] = 1;
  have_reachability_ = true;
}

std::vector<std::vector<std::string>> Reducer::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> names;
  for (const auto& b : buckets_) names.push_back(b.grad_bucket.parameter_names_);
  return names;
}

std::string Reducer::where() const {
  return "rank " + std::to_string(group_.ranks()[group_.rank()]) + " of group " + group_.name();
}

void Reducer::on_output_gradient() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (in_backward_) return;
  check_join_announcement();
  if (!sync_enabled_) return;
  try {
    begin_backward();
  } catch (...) {
    abort_backward();
    throw;
  }
}

bool Reducer::static_graph_ready(size_t index) {
  if (recorded_hook_calls_.empty()) return false;  // the first backward: everything waits for its end
  const int expected = recorded_hook_calls_[index];
  if (hook_calls_[index] > expected)
    throw Error("DistributedDataParallel (static_graph): parameter '" + params_[index].name + "' got a gradient " +
                std::to_string(hook_calls_[index]) + " times in this backward on " + where() + " but " +
                std::to_string(expected) + " times in the first one; static_graph needs the same graph in every iteration");
  return hook_calls_[index] == expected;
}

void Reducer::on_gradient(size_t index) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!in_backward_) check_join_announcement();
  used_since_sync_[index] = 1;
  if (!sync_enabled_) return;  // no_sync: the gradient just accumulates in .grad
  try {
    if (!in_backward_) begin_backward();
    ++hook_calls_[index];
    if (options_.static_graph()) {
      got_gradient_[index] = 1;
      if (static_graph_ready(index)) {
        mark_ready(index);
        finish_buckets(/*wait=*/false);
      }
      return;
    }
    if (ready_[index]) {
      const std::string& name = params_[index].name;
      if (got_gradient_[index])
        throw Error("DistributedDataParallel: parameter '" + name +
                    "' got a gradient twice in one backward (on " + where() +
                    "), as a layer checkpointed or recomputed twice gives; construct DDP with "
                    "DistributedDataParallelOptions().static_graph(true) if every iteration's graph is the same");
      throw Error("DistributedDataParallel: parameter '" + name + "' got a gradient in backward (on " + where() +
                  ") although it cannot reach the outputs of the forward calls made through DistributedDataParallel "
                  "since the last backward, so it was reduced as unused; backpropagate from those outputs, or call "
                  "the module directly (without forward()/prepare_for_backward) so unused parameters are found at the end of backward");
    }
    got_gradient_[index] = 1;
    mark_ready(index);
    finish_buckets(/*wait=*/false);
  } catch (...) {
    abort_backward();
    throw;
  }
}

void Reducer::begin_backward() {
  reset_backward_state();
  in_backward_ = true;
  std::weak_ptr<Reducer> self = shared_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto reducer = self.lock()) reducer->finalize_backward();
  });
  if (options_.find_unused_parameters() && have_reachability_) {
    // Parameters that cannot get a gradient in this backward: ready right away, so their
    // buckets need not wait for the end of backward.
    for (size_t k = 0; k < params_.size(); ++k)
      if (!reachable_[k]) mark_ready(k);
  }
  for (size_t k = 0; k < recorded_hook_calls_.size(); ++k)  // static_graph: its unused parameters
    if (recorded_hook_calls_[k] == 0) mark_ready(k);
}

void Reducer::reset_backward_state() {
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(got_gradient_.begin(), got_gradient_.end(), 0);
  std::fill(hook_calls_.begin(), hook_calls_.end(), 0);
  if (recorded_globally_used_.empty())
    std::fill(globally_used_.begin(), globally_used_.end(), 1);
  else
    globally_used_ = recorded_globally_used_;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.finished = false;
    b.work = Work();
  }
  next_to_launch_ = 0;
  next_to_finish_ = 0;
}

void Reducer::mark_ready(size_t index) {
  Param& p = params_[index];
  Bucket& bucket = buckets_[p.bucket];
  const at::Tensor& view = bucket.grad_bucket.gradients_[p.slot];
  {
    torch::NoGradGuard no_grad;
    at::Tensor& grad = p.tensor.mutable_grad();
    // Without a comm hook the bucket is summed over ranks: scale by 1/N while copying in (as
    // PyTorch's reducer does), which keeps the division off the end of backward.
    const int64_t divisor = divisor_ > 0 ? divisor_ : group_.size();
    const bool scale = !comm_hook_ && divisor > 1;
    if (!grad.defined()) {
      view.zero_();
    } else if (is_bucket_view(grad, view)) {
      if (scale) view.mul_(1.0 / divisor);
    } else {
      if (scale) {
        at::Tensor out = view;
        at::mul_out(out, grad, at::scalar_tensor(1.0 / divisor, grad.options()));
      } else
        view.copy_(grad);
      if (options_.gradient_as_bucket_view()) grad = view;
    }
  }
  ready_[index] = 1;
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    Bucket& bucket = buckets_[next_to_launch_++];
    bucket.launched = true;
    if (comm_hook_)
      bucket.work = comm_hook_(bucket.grad_bucket);
    else
      bucket.work = all_reduce(bucket.grad_bucket.buffer_, ReduceOp::SUM, group_, /*async_op=*/true);  // scaled in mark_ready
  }
}

void Reducer::finish_buckets(bool wait) {
  while (next_to_finish_ < next_to_launch_) {
    Bucket& bucket = buckets_[next_to_finish_];
    if (!wait) {
      if (!bucket.work.is_completed()) return;
      // Whether a parameter no rank used keeps its .grad is known only at the end (static_graph:
      // since the first backward).
      for (size_t k : bucket.params)
        if (!got_gradient_[k] && recorded_globally_used_.empty()) return;
    }
    bucket.work.wait();  // rethrows a failed reduction
    finish_bucket(bucket);
    ++next_to_finish_;
  }
}

void Reducer::finish_bucket(Bucket& bucket) {
  {
    torch::NoGradGuard no_grad;
    for (size_t k : bucket.params) {
      if (!globally_used_[k]) continue;  // no rank used it: .grad stays as it was
      Param& p = params_[k];
      const at::Tensor& view = bucket.grad_bucket.gradients_[p.slot];
      at::Tensor& grad = p.tensor.mutable_grad();
      if (options_.gradient_as_bucket_view()) {
        if (!is_bucket_view(grad, view)) grad = view;
      } else if (grad.defined()) {
        grad.copy_(view);
      } else {
        grad = view.clone();
      }
    }
  }
  bucket.finished = true;
  for (auto& callback : reduced_callbacks_) callback(bucket.grad_bucket);
}

void Reducer::finalize_backward() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!in_backward_) return;
  try {
    std::vector<std::string> missing;
    std::vector<size_t> missing_index;
    for (size_t k = 0; k < params_.size(); ++k)
      if (!ready_[k]) {
        missing.push_back(params_[k].name);
        missing_index.push_back(k);
      }
    const bool recording = options_.static_graph() && recorded_hook_calls_.empty();
    if (options_.static_graph() && !recording && !missing.empty()) {
      std::string counts;
      for (size_t k : missing_index)
        counts += (counts.empty() ? "'" : ", '") + params_[k].name + "' " + std::to_string(hook_calls_[k]) + " of " +
                  std::to_string(recorded_hook_calls_[k]);
      throw Error("DistributedDataParallel (static_graph): backward finished on " + where() + " but " +
                  std::to_string(missing.size()) + " parameter(s) got fewer gradients than in the first backward (" +
                  counts + "); static_graph needs the same graph in every iteration. Gradients were not averaged "
                  "in this backward.");
    }
    if (!missing.empty() && !options_.find_unused_parameters() && !options_.static_graph()) {
      std::ostringstream indices;
      for (size_t i = 0; i < missing_index.size(); ++i) indices << (i ? ", " : "") << missing_index[i];
      throw Error("DistributedDataParallel: backward finished on " + where() + " but " +
                  std::to_string(missing.size()) + " parameter(s) got no gradient, so their buckets could not be reduced: " +
                  quoted_names(missing) + " (indices " + indices.str() + " in the module's parameters that require grad). "
                  "If the model has parameters that do not take part in every forward, construct it with "
                  "DistributedDataParallelOptions().find_unused_parameters(true); otherwise make sure every output "
                  "of the model contributes to the loss. Gradients were not averaged in this backward.");
    }
    for (size_t k : missing_index) mark_ready(k);
    if ((options_.find_unused_parameters() && !options_.static_graph()) || recording) reduce_used_map(used_since_sync_);
    if (recording) record_static_graph();
    finish_buckets(/*wait=*/true);
    end_backward();
  } catch (...) {
    abort_backward();
    throw;
  }
}

// A parameter no rank used since the last synchronization keeps its .grad untouched.
void Reducer::reduce_used_map(const std::vector<char>& local) {
  at::Tensor used = at::tensor(std::vector<int>(local.begin(), local.end()), at::kInt).to(params_.front().tensor.device());
  all_reduce(used, ReduceOp::MAX, group_);
  used = used.cpu().contiguous();
  const int* global = used.data_ptr<int>();
  for (size_t k = 0; k < params_.size(); ++k) globally_used_[k] = global[k] != 0;
}

void Reducer::end_backward() {
  in_backward_ = false;
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), 0);
  std::fill(reachable_.begin(), reachable_.end(), 0);
  have_reachability_ = false;
  if (join_joinable_) join_announced_ = -1;
}

void Reducer::record_static_graph() {
  recorded_hook_calls_ = hook_calls_;
  recorded_globally_used_ = globally_used_;
}

void Reducer::abort_backward() noexcept {
  for (size_t b = next_to_finish_; b < next_to_launch_; ++b) {
    try {
      buckets_[b].work.wait();
    } catch (...) {
    }
  }
  reset_backward_state();
  end_backward();
}

}  // namespace fsdpp::detail
