// DistributedDataParallel under Join (uneven inputs), as PyTorch's DistributedDataParallel.join()
// and _DDPJoinHook. Per iteration, a rank still training issues in its forward: Join's
// notification (when DDP is the first joinable), one all_reduce (MAX) of {a candidate rank,
// whether the backward synchronizes}, and with broadcast_buffers the buffers' broadcast from the
// highest candidate; then in its backward the buckets' reductions (and the used-parameter map
// with find_unused_parameters). A joined rank's main_hook issues the same after Join's count.
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/collectives.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/error.h>

#include "ddp/module_states.h"
#include "ddp/reducer.h"

namespace fsdpp {

using DDP = DistributedDataParallel<torch::nn::Module>;

namespace detail {
namespace {

struct Agreement {
  int highest_candidate;  // group rank; -1 when no rank was a candidate
  bool synchronize;
};

// One all_reduce (MAX) that every rank of the group joins: the highest group rank among the
// candidates, and whether any rank's backward synchronizes.
Agreement agree(bool candidate, bool synchronize, const ProcessGroup& group, c10::Device device) {
  at::Tensor t = at::tensor(std::vector<int64_t>{candidate ? group.rank() : -1, synchronize ? 1 : 0}, at::kLong).to(device);
  all_reduce(t, ReduceOp::MAX, group);
  t = t.cpu();
  return {static_cast<int>(t[0].item<int64_t>()), t[1].item<int64_t>() != 0};
}

std::vector<at::Tensor> buffers_of(torch::nn::Module& module) {
  return tensors_of(unique_named(module.named_buffers(/*recurse=*/true)));
}

}  // namespace

class DDPJoinHook : public JoinHook {
 public:
  // `in_join`: the joinable standing for `ddp` in the Join (the one to notify with).
  DDPJoinHook(DDP& ddp, Joinable* in_join, bool divide_by_initial_world_size) : ddp_(ddp) {
    ddp_.reducer_->begin_join(in_join, divide_by_initial_world_size);
  }
  ~DDPJoinHook() override { ddp_.reducer_->end_join(); }
  DDPJoinHook(const DDPJoinHook&) = delete;
  DDPJoinHook& operator=(const DDPJoinHook&) = delete;

  // Shadows one iteration of the ranks still training (see the top of this file).
  void main_hook() override {
    const Agreement a = agree(false, false, ddp_.process_group(), ddp_.join_device());
    if (ddp_.options().broadcast_buffers()) broadcast_coalesced(buffers_of(*ddp_.module_), a.highest_candidate, ddp_.process_group());
    if (a.synchronize) ddp_.reducer_->run_joined_iteration();
  }

  // As PyTorch's _sync_final_model: the joined ranks did not step for the iterations they
  // shadowed, so every rank takes the parameters (and buffers with broadcast_buffers) of the
  // highest rank among the last joiners.
  void post_hook(bool is_last_joiner) override {
    const ProcessGroup& group = ddp_.process_group();
    const int root = agree(is_last_joiner, false, group, ddp_.join_device()).highest_candidate;
    if (root < 0) throw Error("DistributedDataParallel: Join's post hook found no last joiner in group " + group.name());
    std::vector<at::Tensor> state = tensors_of(unique_named(ddp_.module_->named_parameters(/*recurse=*/true)));
    if (ddp_.options().broadcast_buffers())
      for (auto& b : buffers_of(*ddp_.module_)) state.push_back(b);
    broadcast_coalesced(state, root, group);
  }

 private:
  DDP& ddp_;
};

}  // namespace detail

void DDP::pre_forward_in_join() {
  detail::Reducer& reducer = *reducer_;
  reducer.check_no_backward_pending();
  const int64_t not_joined = Join::notify_join_context(*reducer.join_joinable());
  const bool will_sync = reducer.sync_enabled() && torch::GradMode::is_enabled();
  const detail::Agreement a = detail::agree(true, will_sync, process_group(), join_device());
  if (options().broadcast_buffers()) detail::broadcast_coalesced(detail::buffers_of(*module_), a.highest_candidate, process_group());
  reducer.announce_forward(will_sync, not_joined);
}

std::unique_ptr<JoinHook> DDP::join_hook() { return join_hook_for(this, /*divide_by_initial_world_size=*/true); }

std::unique_ptr<JoinHook> DDP::join_hook_for(Joinable* in_join, bool divide_by_initial_world_size) {
  if (options().static_graph() && !reducer_->graph_recorded())
    throw Error("DistributedDataParallel: static_graph under Join needs the graph recorded first: run one "
                "synchronized iteration (forward and backward) on every rank before the Join (rank " +
                std::to_string(process_group().global_rank(process_group().rank())) + " of group " +
                process_group().name() + ")");
  return std::make_unique<detail::DDPJoinHook>(*this, in_join, divide_by_initial_world_size);
}

ProcessGroup DDP::join_process_group() const { return process_group(); }

c10::Device DDP::join_device() const { return module_->parameters().front().device(); }

void DDP::join(const std::function<void()>& body, DistributedDataParallelJoinOptions options) {
  // A Joinable whose hook carries the options (fsdpp::Joinable's join_hook takes none).
  struct WithOptions : Joinable {
    DDP& ddp;
    bool divide;
    WithOptions(DDP& d, bool v) : ddp(d), divide(v) {}
    std::unique_ptr<JoinHook> join_hook() override { return ddp.join_hook_for(this, divide); }
    ProcessGroup join_process_group() const override { return ddp.join_process_group(); }
    c10::Device join_device() const override { return ddp.join_device(); }
  } joinable(*this, options.divide_by_initial_world_size());
  Join({&joinable}, options.enable(), options.throw_on_early_termination()).run(body);
}

}  // namespace fsdpp
