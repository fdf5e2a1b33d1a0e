// The reducer's part in Join (uneven inputs): what a forward of a rank still training
// announces, the checks that its backward matches, and a joined rank's shadow of one
// synchronized backward (see reducer.h).
#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/error.h>

#include "ddp/reducer.h"

namespace fsdpp::detail {

void Reducer::begin_join(Joinable* joinable, bool divide_by_initial_world_size) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (join_joinable_)
    throw Error("DistributedDataParallel: already in an active Join context on " + where() + " (Join contexts do not nest)");
  if (in_backward_) throw Error("DistributedDataParallel: cannot enter a Join context during backward on " + where());
  join_joinable_ = joinable;
  join_divide_by_initial_world_size_ = divide_by_initial_world_size;
  join_announced_ = -1;
  divisor_ = 0;
}

void Reducer::end_join() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  join_joinable_ = nullptr;
  join_announced_ = -1;
  divisor_ = 0;
}

Joinable* Reducer::join_joinable() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return join_joinable_;
}

bool Reducer::sync_enabled() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return sync_enabled_;
}

bool Reducer::graph_recorded() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return !recorded_hook_calls_.empty();
}

void Reducer::check_no_backward_pending() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (join_joinable_ && join_announced_ == 1)
    throw Error("DistributedDataParallel under Join: forward called on " + where() +
                " before the backward of the previous forward; under Join every iteration is one forward "
                "and its backward (the joined ranks shadow them as such)");
}

void Reducer::announce_forward(bool will_sync, int64_t not_joined) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  join_announced_ = will_sync ? 1 : 0;
  divisor_ = !join_divide_by_initial_world_size_ && not_joined > 0 ? not_joined : 0;
}

void Reducer::check_join_announcement() const {
  if (!join_joinable_) return;
  if (join_announced_ < 0)
    throw Error("DistributedDataParallel under Join: a backward began on " + where() +
                " without a forward through DistributedDataParallel in this iteration; under Join each "
                "iteration must call ddp.forward() (or ddp.pre_forward() before the module's own forward), "
                "which tells the joined ranks what to shadow");
  if ((join_announced_ == 1) != sync_enabled_)
    throw Error(std::string("DistributedDataParallel under Join: this backward on ") + where() +
                (sync_enabled_ ? " synchronizes gradients but its forward ran under no_sync() or without gradients"
                               : " runs under no_sync() but its forward did not") +
                "; under Join, no_sync() must cover the forward as well as the backward (as in PyTorch), since "
                "the forward tells the joined ranks whether to shadow the backward's reductions");
}

void Reducer::run_joined_iteration() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (in_backward_) throw Error("DistributedDataParallel: a joined rank's join hook ran during backward on " + where());
  try {
    reset_backward_state();
    in_backward_ = true;
    {
      torch::NoGradGuard no_grad;
      for (auto& bucket : buckets_) {
        bucket.grad_bucket.buffer_.zero_();
        bucket.pending = 0;
      }
    }
    std::fill(ready_.begin(), ready_.end(), 1);
    launch_ready_buckets();
    if (options_.find_unused_parameters() && !options_.static_graph())
      reduce_used_map(std::vector<char>(params_.size(), 0));
    finish_buckets(/*wait=*/true);
    end_backward();
  } catch (...) {
    abort_backward();
    throw;
  }
}

}  // namespace fsdpp::detail
